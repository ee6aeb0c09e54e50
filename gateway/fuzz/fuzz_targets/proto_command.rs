//! `gateway::session::fuzzing::proto_command`: see there for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gateway::session::fuzzing::proto_command(data));
