//! Pods going away while the room is full: each drained and started again
//! in turn (a rolling restart), then one killed with SIGKILL; what the
//! members were sent meanwhile.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::cluster::Cluster;
use super::member::{Room, Tally};
use super::outcome::{Kill, Restart};
use super::query::Reader;
use super::{Deadline, Members, Options, TAIL, counts, publisher};
use crate::Error;
use crate::latency::now_micros;

/// Phase 5: each pod drained and started again, in turn.
pub(super) async fn rolling_restart(
    cluster: &mut Cluster,
    room: &Arc<Room>,
    members: &Members,
    flow: &publisher::Flow,
    options: &Options,
    topic: &str,
) -> Result<Restart, Error> {
    members.reset_phase();
    let resumed_before = members.sum(|t| u64::from(t.resumed.load(Ordering::Relaxed)));
    let fresh_before = members.sum(|t| u64::from(t.fresh.load(Ordering::Relaxed)));
    let published_before = flow.published.load(Ordering::Relaxed);
    let errors_before = flow.errors.load(Ordering::Relaxed);
    let started = Instant::now();
    let mut drain_s = Vec::with_capacity(options.pods);
    let mut all_back = true;
    let mut terms_us = Vec::with_capacity(options.pods);
    room.recording.store(true, Ordering::Relaxed);
    for n in 0..options.pods {
        room.up[n].store(false, Ordering::Relaxed);
        terms_us.push(now_micros());
        drain_s.push(cluster.restart(n).await?);
        room.up[n].store(true, Ordering::Relaxed);
        let wait = Deadline::new(options.settle);
        let back = loop {
            if members.connected() == options.members {
                break true;
            }
            if !wait.again().await {
                break false;
            }
        };
        println!(
            "presence: pod {n} restarted (drain {:.1} s), every member back: {back}",
            drain_s[n]
        );
        all_back &= back;
    }
    let took_s = started.elapsed().as_secs_f64();
    let mut reader = Reader::new(cluster.pods[0].addr, topic);
    let everyone = options.members as u64;
    let wait = Deadline::new(options.settle);
    loop {
        if counts(&mut reader, everyone).await {
            break;
        }
        if !wait.again().await {
            all_back = false;
            println!(
                "presence: after the restart, presence showed {}",
                reader.last
            );
            break;
        }
    }
    tokio::time::sleep(TAIL).await;
    room.recording.store(false, Ordering::Relaxed);
    let left_users = strays(room, members, &terms_us, &drain_s);
    let min_users = members
        .tallies
        .iter()
        .map(|t| t.least_users.load(Ordering::Relaxed))
        .min()
        .filter(|&u| u != u64::MAX);
    Ok(Restart {
        took_s,
        drain_s,
        resumed: members.sum(|t| u64::from(t.resumed.load(Ordering::Relaxed))) - resumed_before,
        fresh: members.sum(|t| u64::from(t.fresh.load(Ordering::Relaxed))) - fresh_before,
        min_users,
        left_users,
        all_back,
        published: flow.published.load(Ordering::Relaxed) - published_before,
        publish_errors: flow.errors.load(Ordering::Relaxed) - errors_before,
        diffs: members.diffs(),
    })
}

/// Phase 6: the pod with the most members killed; its members stay away.
pub(super) async fn kill(
    cluster: &mut Cluster,
    room: &Arc<Room>,
    members: &Members,
    options: &Options,
    topic: &str,
) -> Result<Kill, Error> {
    let by_pod = members.by_pod(options.pods);
    let pod = (0..options.pods).max_by_key(|&p| by_pod[p]).unwrap_or(0);
    let survivor = (pod + 1) % options.pods;
    let victims: Vec<&Arc<Tally>> = members
        .tallies
        .iter()
        .filter(|t| t.connected.load(Ordering::Relaxed) && t.pod.load(Ordering::Relaxed) == pod)
        .collect();
    for t in &victims {
        t.stay_away.store(true, Ordering::Relaxed);
    }
    let gone = victims.len() as u64;
    members.reset_phase();
    room.leave_target.store(gone as u32, Ordering::Relaxed);
    room.up[pod].store(false, Ordering::Relaxed);
    let killed_at = now_micros();
    cluster.kill(pod);
    println!("presence: killed pod {pod} with {gone} members");
    let mut reader = Reader::new(cluster.pods[survivor].addr, topic);
    let left = options.members as u64 - gone;
    let wait = Deadline::new(options.kill_wait);
    let gone_s = loop {
        if counts(&mut reader, left).await {
            break Some(wait.elapsed_s());
        }
        if !wait.again().await {
            println!("presence: after the kill, presence showed {}", reader.last);
            break None;
        }
    };
    let subscribers = move || {
        members
            .tallies
            .iter()
            .filter(|t| !t.stay_away.load(Ordering::Relaxed))
    };
    let all_told = loop {
        if subscribers().all(|t| t.leaves_done_us.load(Ordering::Relaxed) != 0) {
            break true;
        }
        if !wait.again().await {
            break false;
        }
    };
    let last_told = subscribers()
        .map(|t| t.leaves_done_us.load(Ordering::Relaxed))
        .max()
        .unwrap_or(0);
    tokio::time::sleep(TAIL).await;
    Ok(Kill {
        pod,
        members: gone,
        gone_s,
        leaves_s: all_told.then(|| last_told.saturating_sub(killed_at) as f64 / 1e6),
        short_of_leaves: subscribers()
            .filter(|t| t.leaves_done_us.load(Ordering::Relaxed) == 0)
            .count() as u64,
        diffs: members.diffs(),
    })
}

/// How many users were listed as leaving during the restart (nobody left);
/// prints the first of them, each with its own last journey against its
/// pod's SIGTERM and exit, to tell which rule let them go.
fn strays(room: &Room, members: &Members, terms_us: &[u64], drain_s: &[f64]) -> u64 {
    let seen = room.leaves_seen.lock().unwrap_or_else(|p| p.into_inner());
    let mut strays: Vec<(&String, &u64)> = seen.iter().collect();
    strays.sort_by_key(|(_, at)| **at);
    println!(
        "presence: {} users listed as leaving in the restart",
        strays.len()
    );
    for (user, at) in strays.iter().take(20) {
        let Some(t) = user
            .strip_prefix('m')
            .and_then(|i| i.parse::<usize>().ok())
            .and_then(|i| members.tallies.get(i))
        else {
            continue;
        };
        let by = t.advised_by.load(Ordering::Relaxed);
        let Some(term) = terms_us.get(by) else {
            println!("  {user}: leave at {at}, advised by pod {by}?");
            continue;
        };
        let rel = |us: u64| (us as f64 - *term as f64) / 1e6;
        println!(
            "  {user}: advised by pod {by} (exit {:.2} s after SIGTERM) to come back after {} ms; lost {:.2} s, back {:.2} s on pod {}, leave seen {:.2} s",
            drain_s.get(by).copied().unwrap_or(0.0),
            t.advised_ms.load(Ordering::Relaxed),
            rel(t.lost_us.load(Ordering::Relaxed)),
            rel(t.back_us.load(Ordering::Relaxed)),
            t.pod.load(Ordering::Relaxed),
            rel(**at),
        );
    }
    strays.len() as u64
}
