//! A slot and its keys moved to another master, as `redis-cli --cluster
//! reshard` does: in one go, or in two halves to act mid-migration.

use super::topology::owner;
use super::{CLI_TIMEOUT, RedisCluster};
use crate::error::{Error, state};
use crate::process::{blocking, poll};

impl RedisCluster {
    /// Moves `slot` with all its keys to the master on `to`, as
    /// `redis-cli --cluster reshard` does, and waits until every node agrees.
    pub async fn migrate_slot(&self, slot: u16, to: u16) -> Result<(), Error> {
        blocking(|| self.begin_migration(slot, to))?;
        self.finish_migration(slot, to).await
    }

    /// The first half of a migration: `to` imports `slot`, its master
    /// migrates it, and the keys there now move. The slot stays with its
    /// master (which answers `ASK` for keys it no longer has) until
    /// [`RedisCluster::finish_migration`].
    pub fn begin_migration(&self, slot: u16, to: u16) -> Result<(), Error> {
        let from = self.master_of_slot(slot)?;
        if from == to {
            return Err(state(format!("slot {slot} is on {to} already")));
        }
        let slot_arg = slot.to_string();
        self.ok(
            to,
            &[
                "CLUSTER",
                "SETSLOT",
                &slot_arg,
                "IMPORTING",
                &self.id(from)?,
            ],
        )?;
        self.ok(
            from,
            &["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &self.id(to)?],
        )?;
        self.move_keys(slot, from, to)
    }

    /// The second half: the keys left move, then `to` owns `slot` (told to
    /// `to`, the old master and every other master, in that order); waits
    /// until every node sees it so.
    pub async fn finish_migration(&self, slot: u16, to: u16) -> Result<(), Error> {
        blocking(|| {
            let from = self.master_of_slot(slot)?;
            self.move_keys(slot, from, to)?;
            let slot_arg = slot.to_string();
            let to_id = self.id(to)?;
            let others: Vec<u16> = self
                .masters()?
                .into_iter()
                .filter(|&p| p != from && p != to)
                .collect();
            for port in [to, from].into_iter().chain(others) {
                self.ok(port, &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &to_id])?;
            }
            Ok::<_, Error>(())
        })?;
        poll(CLI_TIMEOUT, || {
            let view = self.settled()?;
            match owner(&view, slot) {
                Some(p) if p == to => Ok(()),
                other => Err(format!("slot {slot} is with {other:?}, not {to}")),
            }
        })
        .await
    }

    /// `MIGRATE`s the keys of `slot` from `from` to `to`, 100 at a time,
    /// until `from` has none.
    fn move_keys(&self, slot: u16, from: u16, to: u16) -> Result<(), Error> {
        let (slot, to) = (slot.to_string(), to.to_string());
        loop {
            let listed = self.cli(from, &["CLUSTER", "GETKEYSINSLOT", &slot, "100"])?;
            let keys: Vec<&str> = listed.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                return Ok(());
            }
            let mut args = vec!["MIGRATE", "127.0.0.1", &to, "", "0", "5000", "KEYS"];
            args.extend(keys);
            // NOKEY: they all expired in between.
            let answer = self.cli(from, &args)?;
            if !matches!(answer.trim(), "OK" | "NOKEY") {
                return Err(state(format!("{args:?} on {from}: {answer}")));
            }
        }
    }
}
