//! What the room's presence costs Redis: the memory of its keys (`MEMORY
//! USAGE`, every field counted: `SAMPLES 0`), and the commands the pods
//! send it over a window (`INFO commandstats` before and after), writes
//! told apart by the command's own `write` flag (`COMMAND INFO`). Commands
//! a pod's Lua script runs are counted under their own names, so a script
//! that writes shows as its writes.
//!
//! Read through `redis-cli` (the rig's), which blocks its thread for a few
//! milliseconds per call: fine between the scenario's phases.

use std::collections::BTreeMap;

use rig::Redis;
use serde::{Deserialize, Serialize};

use crate::Error;

/// The keys whose name holds this: presence's, whatever the router names
/// them (`<prefix>:presence:{<topic>}`, the pods' liveness set, ...).
const PRESENCE_PATTERN: &str = "*presence*";
/// Commands the tool itself sends while it looks: not the pods'.
const OURS: [&str; 5] = ["info", "memory", "scan", "command", "ping"];

/// Presence's keys and their bytes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Memory {
    /// The room's own keys (their name holds the topic), summed.
    pub room_bytes: u64,
    /// Presence keys of no one room (the pods' liveness, their topic
    /// sets), summed.
    pub shared_bytes: u64,
    /// Every presence key with its bytes.
    pub keys: BTreeMap<String, u64>,
}

/// Commands over a window, by name, and how many of them write.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Commands {
    pub window_s: f64,
    /// Calls of write commands over the window.
    pub writes: u64,
    /// Calls of every command the pods sent (the tool's own left out).
    pub calls: u64,
    /// Calls by command, those with none left out.
    pub by_command: BTreeMap<String, u64>,
    /// The commands among them that write.
    pub writing: Vec<String>,
}

/// The presence keys now and their memory; the room's are those whose name
/// holds `topic`.
pub fn memory(redis: &Redis, topic: &str) -> Result<Memory, Error> {
    let memory = rig::process::blocking(|| -> Result<Memory, rig::Error> {
        let listed = redis.cli(&["--scan", "--pattern", PRESENCE_PATTERN])?;
        let mut memory = Memory::default();
        for key in listed.lines().map(str::trim).filter(|k| !k.is_empty()) {
            let bytes = redis
                .cli(&["MEMORY", "USAGE", key, "SAMPLES", "0"])?
                .trim()
                .parse::<u64>()
                .unwrap_or(0);
            if key.contains(topic) {
                memory.room_bytes += bytes;
            } else {
                memory.shared_bytes += bytes;
            }
            memory.keys.insert(key.to_owned(), bytes);
        }
        Ok(memory)
    })?;
    Ok(memory)
}

/// Calls so far, by command (`INFO commandstats`).
pub fn calls(redis: &Redis) -> Result<BTreeMap<String, u64>, Error> {
    let text = rig::process::blocking(|| redis.cli(&["INFO", "commandstats"]))?;
    Ok(parse_commandstats(&text))
}

/// The commands called between `before` and `after`, over `window_s`.
pub fn between(
    redis: &Redis,
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
    window_s: f64,
) -> Result<Commands, Error> {
    let mut commands = Commands {
        window_s,
        ..Commands::default()
    };
    for (name, &calls) in after {
        let delta = calls.saturating_sub(before.get(name).copied().unwrap_or(0));
        if delta == 0 || OURS.contains(&name.as_str()) {
            continue;
        }
        commands.calls += delta;
        commands.by_command.insert(name.clone(), delta);
        if writes(redis, name)? {
            commands.writes += delta;
            commands.writing.push(name.clone());
        }
    }
    Ok(commands)
}

/// Whether `command` carries Redis's `write` flag. A subcommand
/// (`config|get`) is asked about by its container's name.
fn writes(redis: &Redis, command: &str) -> Result<bool, Error> {
    let name = command.split('|').next().unwrap_or(command);
    let info = rig::process::blocking(|| redis.cli(&["COMMAND", "INFO", name]))?;
    Ok(info.lines().any(|line| line.trim() == "write"))
}

/// `cmdstat_<name>:calls=<n>,...` lines, by name.
fn parse_commandstats(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|line| {
            let (name, rest) = line.trim().strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .split(',')
                .find_map(|field| field.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_are_read_by_name() {
        let text = "# Commandstats\r\n\
                    cmdstat_hset:calls=12,usec=40,usec_per_call=3.33,rejected_calls=0,failed_calls=0\r\n\
                    cmdstat_config|get:calls=1,usec=9,usec_per_call=9.00,rejected_calls=0,failed_calls=0\r\n\
                    cmdstat_evalsha:calls=3,usec=90,usec_per_call=30.00,rejected_calls=0,failed_calls=1\r\n";
        let calls = parse_commandstats(text);
        assert_eq!(calls.len(), 3);
        assert_eq!(calls["hset"], 12);
        assert_eq!(calls["config|get"], 1);
        assert_eq!(calls["evalsha"], 3);
    }
}
