//! `gateway::session::fuzzing::compressed_script`: see there for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gateway::session::fuzzing::compressed_script(data));
