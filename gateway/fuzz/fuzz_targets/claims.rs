//! `gateway::auth::fuzzing::claims`: see there for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gateway::auth::fuzzing::claims(data));
