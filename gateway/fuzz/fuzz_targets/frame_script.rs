//! `gateway::session::fuzzing::frame_script`: see there for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gateway::session::fuzzing::frame_script(data));
