#!/usr/bin/env python3
"""Tokens and keys for Herald's auth tests, made by an implementation other
than ours: PyJWT and `cryptography`.

Usage: mint.py SPEC   or   echo SPEC | mint.py

SPEC is one JSON object, or a list of them (then one output line each):

  {"alg": "HS256", "secret": "...", "claims": {...}, "headers": {"kid": "a"}}
  {"alg": "RS256", "key_file": "rsa.key.pem", "claims": {...}}
      A JWS signed by PyJWT. `headers` are added to (or override) the header.
  {"alg": "none", "claims": {...}}
      An unsigned token, built by hand (PyJWT refuses to make one).
  {"alg": "HS256", "secret_file": "rsa.pub.pem", "claims": {...}}
      HMAC over the file's bytes as the secret, built by hand: PyJWT refuses
      a PEM as an HMAC secret, which is what the algorithm-confusion attack
      needs.
  {"op": "keygen", "kind": "rsa" | "ec", "dir": "/tmp/x", "name": "a"}
      Writes DIR/NAME.key.pem (PKCS#8) and DIR/NAME.pub.pem (SPKI);
      prints the public key's path.
  {"op": "jwk", "pub_file": "a.pub.pem", "kid": "a", "alg": "RS256"}
      The public key as a JWK (one line of JSON).

Exits 0, or 1 with the reason on stderr.
"""

import base64
import hashlib
import hmac
import json
import os
import sys

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def compact(header, claims):
    """The first two parts of a JWS: header and payload, base64url."""
    return (
        b64url(json.dumps(header, separators=(",", ":")).encode())
        + "."
        + b64url(json.dumps(claims, separators=(",", ":")).encode())
    )


def token(spec):
    alg = spec.get("alg", "HS256")
    claims = spec.get("claims", {})
    headers = spec.get("headers", {})
    if alg == "none":
        header = {"alg": "none", "typ": "JWT", **headers}
        return compact(header, claims) + "."
    if "secret_file" in spec:
        digests = {"HS256": hashlib.sha256, "HS384": hashlib.sha384, "HS512": hashlib.sha512}
        with open(spec["secret_file"], "rb") as f:
            secret = f.read()
        signing_input = compact({"alg": alg, "typ": "JWT", **headers}, claims)
        mac = hmac.new(secret, signing_input.encode(), digests[alg]).digest()
        return signing_input + "." + b64url(mac)
    if "key_file" in spec:
        with open(spec["key_file"], "rb") as f:
            key = f.read()
    else:
        key = spec["secret"].encode()
    return jwt.encode(claims, key, algorithm=alg, headers=headers or None)


def keygen(spec):
    if spec["kind"] == "rsa":
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    elif spec["kind"] == "ec":
        key = ec.generate_private_key(ec.SECP256R1())
    else:
        raise ValueError(f"unknown key kind {spec['kind']!r}")
    base = os.path.join(spec["dir"], spec["name"])
    with open(base + ".key.pem", "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    with open(base + ".pub.pem", "wb") as f:
        f.write(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    return base + ".pub.pem"


def jwk(spec):
    with open(spec["pub_file"], "rb") as f:
        public = serialization.load_pem_public_key(f.read())
    if isinstance(public, rsa.RSAPublicKey):
        value = jwt.algorithms.RSAAlgorithm.to_jwk(public, as_dict=True)
    else:
        value = jwt.algorithms.ECAlgorithm.to_jwk(public, as_dict=True)
    value["kid"] = spec["kid"]
    if "alg" in spec:
        value["alg"] = spec["alg"]
    value["use"] = "sig"
    return json.dumps(value, separators=(",", ":"))


def one(spec):
    op = spec.get("op", "token")
    return {"token": token, "keygen": keygen, "jwk": jwk}[op](spec)


def main():
    raw = sys.argv[1] if len(sys.argv) > 1 else sys.stdin.read()
    try:
        spec = json.loads(raw)
        specs = spec if isinstance(spec, list) else [spec]
        for s in specs:
            print(one(s))
    except Exception as e:  # noqa: BLE001 - the test shows it
        print(f"mint: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
