//! What a `presence` run found, phase by phase ([`Presence`]), and its
//! table.

use serde::{Deserialize, Serialize};

use super::footprint::{Commands, Memory};
use super::query::{self, ServerTiming};
use crate::cpu::Usage;
use crate::latency::Summary;
use crate::report::Row;

/// The diffs the members were sent in one phase.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Diffs {
    /// Members counted (subscribers through the phase).
    pub subscribers: u64,
    /// `presence_diff` frames: the most one subscriber got, and all.
    pub frames_max: u64,
    pub frames_total: u64,
    /// Joins and leaves listed in them, over all subscribers.
    pub joins_total: u64,
    pub leaves_total: u64,
    /// Diffs with counts only.
    pub counts_only_total: u64,
}

/// Phase 1.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Join {
    /// Until every member was subscribed and presence counted them all.
    pub all_in_s: Option<f64>,
    pub members_by_pod: Vec<u64>,
    pub diffs: Diffs,
}

/// Phase 2.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FlowPhase {
    pub duration_s: f64,
    pub churners: u64,
    pub published: u64,
    pub messages: u64,
    /// From the publisher's stamp to the member's read.
    pub latency: Summary,
    pub diffs: Diffs,
}

/// Phase 3.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Quiet {
    pub memory: Memory,
    pub commands: Commands,
    /// Writes per member over the window, and per second over all pods.
    pub writes_per_member: f64,
    pub writes_per_s: f64,
    pub diffs: Diffs,
}

/// Phase 4.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Queries {
    pub page_size: u64,
    /// Members in the timed pages.
    pub page_members: u64,
    pub page: Summary,
    pub stats: Summary,
    /// Every page walked: members seen, pages read, and presence's count.
    pub walked_members: u64,
    pub walked_pages: u64,
    pub users: u64,
    /// The pod's own histogram, by label set (empty: not exported).
    pub server: Vec<ServerTiming>,
}

/// Phase 5.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Restart {
    pub took_s: f64,
    /// Each pod's drain, SIGTERM to exit.
    pub drain_s: Vec<f64>,
    /// Comebacks that resumed their session, and that got a fresh one.
    pub resumed: u64,
    pub fresh: u64,
    /// The fewest users a diff sent to a member said the room had
    /// meanwhile (presence is not asked: a query sends the pending diff
    /// at once, so asking often would add diffs).
    pub min_users: Option<u64>,
    /// Users some subscriber was sent a leave of (nobody left: each one
    /// is a resume shown as a leave and a join).
    #[serde(default)]
    pub left_users: u64,
    pub all_back: bool,
    pub published: u64,
    pub publish_errors: u64,
    pub diffs: Diffs,
}

/// Phase 6.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Kill {
    pub pod: usize,
    /// Its members, who stay away.
    pub members: u64,
    /// From the kill until presence (on another pod) counted them gone.
    pub gone_s: Option<f64>,
    /// From the kill until the last other subscriber had all their leaves.
    pub leaves_s: Option<f64>,
    /// Subscribers that had not seen them all by the end of the wait.
    pub short_of_leaves: u64,
    pub diffs: Diffs,
}

/// The result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Presence {
    pub pods: usize,
    pub members: usize,
    pub presence: bool,
    pub topic: String,
    /// Bytes of each member's `info` claim (compact JSON).
    pub info_bytes: usize,
    pub rate_per_s: f64,
    pub join: Join,
    pub flow: FlowPhase,
    pub quiet: Option<Quiet>,
    pub queries: Option<Queries>,
    pub restart: Option<Restart>,
    pub kill: Option<Kill>,
    /// Members' `err` frames and failed attempts, and the last one's text.
    pub member_errors: u64,
    pub last_member_error: Option<String>,
    /// CPU from the join to the queries (phases 1 to 4), the pods and
    /// Redis watched: the pods restarted after are other processes.
    pub cpu: Usage,
    /// What stopped a phase early.
    pub problems: Vec<String>,
}

impl crate::report::Outcome for Presence {
    const SCENARIO: &'static str = "presence";

    fn rows(&self) -> Vec<Row> {
        rows(self)
    }

    fn failures(&self) -> Vec<String> {
        let mut failures = self.problems.clone();
        if self.join.all_in_s.is_none() {
            failures.push("not every member joined".to_owned());
        }
        if let Some(q) = &self.queries
            && q.walked_members != q.users
        {
            failures.push(format!(
                "the pages listed {} members, presence counted {}",
                q.walked_members, q.users
            ));
        }
        if let Some(r) = &self.restart {
            if !r.all_back {
                failures.push("not every member came back after the rolling restart".to_owned());
            }
            if r.fresh > 0 {
                failures.push(format!("{} resumes got a fresh session", r.fresh));
            }
            if r.left_users > 0 {
                failures.push(format!(
                    "{} users who resumed were listed as leaving in the rolling restart",
                    r.left_users
                ));
            }
        }
        if let Some(k) = &self.kill {
            if k.gone_s.is_none() {
                failures.push("the killed pod's members were still listed".to_owned());
            }
            if k.short_of_leaves > 0 {
                failures.push(format!(
                    "{} subscribers were not sent every leave",
                    k.short_of_leaves
                ));
            }
        }
        failures
    }
}

fn rows(r: &Presence) -> Vec<Row> {
    let secs = |s: Option<f64>| s.map_or_else(|| "n/a".to_owned(), |s| format!("{s:.2} s"));
    let diffs = |d: &Diffs| {
        format!(
            "{} max per subscriber, {} frames, {} joins / {} leaves listed",
            d.frames_max, d.frames_total, d.joins_total, d.leaves_total
        )
    };
    let mut rows = vec![
        Row::new(
            "room",
            format!(
                "{} ({} members on {} pods, presence {})",
                r.topic,
                r.members,
                r.pods,
                if r.presence { "on" } else { "off" }
            ),
        ),
        Row::new("join: all in", secs(r.join.all_in_s)),
        Row::new(
            "join: members by pod",
            format!("{:?}", r.join.members_by_pod),
        ),
        Row::new("join: diffs", diffs(&r.join.diffs)),
        Row::new("flow: latency p50 / p99 / max", r.flow.latency.brief()),
        Row::new(
            "flow: churners, diffs",
            format!("{}: {}", r.flow.churners, diffs(&r.flow.diffs)),
        ),
    ];
    if let Some(q) = &r.quiet {
        rows.push(Row::new(
            "quiet: room presence memory",
            format!(
                "{} B ({} B of shared keys)",
                q.memory.room_bytes, q.memory.shared_bytes
            ),
        ));
        rows.push(Row::new(
            "quiet: Redis writes",
            format!(
                "{} over {:.1} s: {:.4} per member, {:.2}/s ({:?})",
                q.commands.writes,
                q.commands.window_s,
                q.writes_per_member,
                q.writes_per_s,
                q.commands.by_command
            ),
        ));
    }
    if let Some(q) = &r.queries {
        rows.push(Row::new(
            format!("page of {} p50 / p99 / max", q.page_size),
            q.page.brief(),
        ));
        rows.push(Row::new("stats p50 / p99 / max", q.stats.brief()));
        rows.push(Row::new(
            "pages walked",
            format!(
                "{} members in {} pages, {} counted",
                q.walked_members, q.walked_pages, q.users
            ),
        ));
        for s in &q.server {
            rows.push(Row::new(
                format!("pod's {}{{{}}} p99 ≤", query::QUERY_SECONDS, s.labels),
                s.p99_at_most_s.map_or_else(
                    || "n/a".to_owned(),
                    |v| format!("{} ms ({} queries)", v * 1000.0, s.count),
                ),
            ));
        }
    }
    if let Some(x) = &r.restart {
        rows.push(Row::new(
            "restart: took",
            format!("{:.1} s (drains {:?})", x.took_s, x.drain_s),
        ));
        rows.push(Row::new("restart: diffs", diffs(&x.diffs)));
        rows.push(Row::new(
            "restart: resumed / fresh",
            format!("{} / {}", x.resumed, x.fresh),
        ));
        rows.push(Row::new(
            "restart: fewest users shown",
            x.min_users
                .map_or_else(|| "n/a".to_owned(), |u| u.to_string()),
        ));
        rows.push(Row::new(
            "restart: users listed as leaving",
            x.left_users.to_string(),
        ));
    }
    if let Some(k) = &r.kill {
        rows.push(Row::new(
            "kill: pod, members",
            format!("{}, {}", k.pod, k.members),
        ));
        rows.push(Row::new("kill: gone from presence", secs(k.gone_s)));
        rows.push(Row::new("kill: every leave sent", secs(k.leaves_s)));
    }
    rows.push(Row::new(
        "member errors",
        format!(
            "{} (last: {})",
            r.member_errors,
            r.last_member_error.as_deref().unwrap_or("-")
        ),
    ));
    rows
}
