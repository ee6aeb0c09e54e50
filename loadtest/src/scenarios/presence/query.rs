//! The room's presence as a backend reads it (`GET /v1/presence/stats`,
//! `GET /v1/presence`, docs/api.md) over a keep-alive connection, timed at
//! the client; and the pod's own timing of the same queries, from its
//! `/metrics` (`herald_presence_query_seconds`, a histogram).

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::Error;
use crate::latency::{Summary, micros};
use crate::metrics::Scraper;

/// The pods' histogram of presence queries.
pub const QUERY_SECONDS: &str = "herald_presence_query_seconds";

/// `GET /v1/presence/stats`.
#[derive(Debug, Clone, Deserialize)]
pub struct Stats {
    pub position: u64,
    pub users: u64,
    pub connections: u64,
}

/// `GET /v1/presence`: one page.
#[derive(Debug, Clone, Deserialize)]
pub struct Page {
    pub position: u64,
    pub users: u64,
    pub members: Vec<PageMember>,
    pub cursor: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct PageMember {
    pub user: String,
}

/// One label set of the pod's histogram: its count and where its p99 falls
/// (the upper bound of the bucket that holds it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerTiming {
    /// The labels besides `le`, as written (`kind="page"`), or empty.
    pub labels: String,
    pub count: u64,
    /// `None` when the p99 is in the `+Inf` bucket.
    pub p99_at_most_s: Option<f64>,
}

/// Reads one pod's presence API.
pub struct Reader {
    http: Scraper,
    topic: String,
    /// The last stats read, or why they could not be: what a wait that
    /// timed out reports.
    pub last: String,
}

impl Reader {
    pub fn new(pod: SocketAddr, topic: &str) -> Self {
        Self {
            http: Scraper::new(pod),
            topic: topic.to_owned(),
            last: "no stats read".to_owned(),
        }
    }

    pub async fn stats(&mut self) -> Result<Stats, Error> {
        let path = format!("/v1/presence/stats?topic={}", encode(&self.topic));
        let stats = match self.get(&path).await {
            Ok(body) => decode::<Stats>(&body),
            Err(e) => Err(e),
        };
        self.last = match &stats {
            Ok(s) => format!(
                "{} users, {} connections at {}",
                s.users, s.connections, s.position
            ),
            Err(e) => e.to_string(),
        };
        stats
    }

    /// The page after `cursor`, of at most `limit` members.
    pub async fn page(&mut self, cursor: Option<&str>, limit: usize) -> Result<Page, Error> {
        let mut path = format!("/v1/presence?topic={}&limit={limit}", encode(&self.topic));
        if let Some(cursor) = cursor {
            path.push_str("&cursor=");
            path.push_str(&encode(cursor));
        }
        let body = self.get(&path).await?;
        decode(&body)
    }

    /// `GET path`; once more on a fresh connection if it fails (the pod
    /// closes a keep-alive connection left idle, as over the quiet window).
    async fn get(&mut self, path: &str) -> Result<String, Error> {
        match self.http.get(path).await {
            Ok(body) => Ok(body),
            Err(_) => self.http.get(path).await,
        }
    }

    /// `count` stats queries back to back, timed at the client.
    pub async fn time_stats(&mut self, count: usize) -> Result<Summary, Error> {
        let mut samples = Vec::with_capacity(count);
        for _ in 0..count {
            let started = Instant::now();
            self.stats().await?;
            samples.push(micros(started.elapsed()));
        }
        Ok(Summary::of(&mut samples))
    }

    /// `count` first pages of `limit` members back to back, timed at the
    /// client; and the members the last one held.
    pub async fn time_pages(
        &mut self,
        count: usize,
        limit: usize,
    ) -> Result<(Summary, usize), Error> {
        let mut samples = Vec::with_capacity(count);
        let mut members = 0;
        for _ in 0..count {
            let started = Instant::now();
            let page = self.page(None, limit).await?;
            samples.push(micros(started.elapsed()));
            members = page.members.len();
        }
        Ok((Summary::of(&mut samples), members))
    }

    /// Every page, cursor after cursor (at most `max_pages`): the members
    /// in order, and the pages read. A member twice, or out of order, is
    /// an error.
    pub async fn walk(&mut self, limit: usize, max_pages: usize) -> Result<(u64, usize), Error> {
        let mut cursor: Option<String> = None;
        let mut last: Option<String> = None;
        let mut members = 0;
        for pages in 1..=max_pages {
            let page = self.page(cursor.as_deref(), limit).await?;
            for member in page.members {
                if last
                    .as_ref()
                    .is_some_and(|l| l.as_bytes() >= member.user.as_bytes())
                {
                    return Err(Error::Options(format!(
                        "presence pages out of order: {} after {}",
                        member.user,
                        last.unwrap_or_default()
                    )));
                }
                last = Some(member.user);
                members += 1;
            }
            match page.cursor {
                Some(next) => cursor = Some(next),
                None => return Ok((members, pages)),
            }
        }
        Err(Error::Options(format!(
            "presence: still a cursor after {max_pages} pages"
        )))
    }

    /// The pod's [`QUERY_SECONDS`] histogram, by label set (none if it
    /// does not export one).
    pub async fn server_timing(&mut self) -> Result<Vec<ServerTiming>, Error> {
        let text = self.get("/metrics").await?;
        Ok(histogram_p99(&text, QUERY_SECONDS))
    }
}

fn decode<T: for<'de> Deserialize<'de>>(body: &str) -> Result<T, Error> {
    serde_json::from_str(body).map_err(|e| Error::Options(format!("presence answer ({e}): {body}")))
}

/// Percent-encodes all but RFC 3986's unreserved characters.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Each label set's count and p99 bucket of the histogram `name` in
/// Prometheus text.
pub fn histogram_p99(text: &str, name: &str) -> Vec<ServerTiming> {
    let prefix = format!("{name}_bucket{{");
    // Label set (without le) -> (le, cumulative count) in the order given.
    let mut buckets: BTreeMap<String, Vec<(f64, u64)>> = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(&prefix) else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once('}') else {
            continue;
        };
        let Some(count) = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        let mut le = None;
        let mut others = Vec::new();
        for label in labels.split(',').filter(|l| !l.is_empty()) {
            match label.strip_prefix("le=") {
                Some(v) => le = Some(v.trim_matches('"').to_owned()),
                None => others.push(label),
            }
        }
        let Some(le) = le else { continue };
        let bound = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap_or(f64::INFINITY)
        };
        buckets
            .entry(others.join(","))
            .or_default()
            .push((bound, count as u64));
    }
    buckets
        .into_iter()
        .map(|(labels, mut bounds)| {
            bounds.sort_by(|a, b| a.0.total_cmp(&b.0));
            let count = bounds.last().map_or(0, |b| b.1);
            let rank = (count as f64 * 0.99).ceil() as u64;
            let p99 = bounds
                .iter()
                .find(|(_, cumulative)| *cumulative >= rank.max(1))
                .map(|(bound, _)| *bound)
                .filter(|b| b.is_finite());
            ServerTiming {
                labels,
                count,
                p99_at_most_s: if count == 0 { None } else { p99 },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_p99_bucket_is_read_per_label_set() {
        let text = "# TYPE herald_presence_query_seconds histogram\n\
            herald_presence_query_seconds_bucket{kind=\"page\",le=\"0.001\"} 50\n\
            herald_presence_query_seconds_bucket{kind=\"page\",le=\"0.005\"} 99\n\
            herald_presence_query_seconds_bucket{kind=\"page\",le=\"+Inf\"} 100\n\
            herald_presence_query_seconds_sum{kind=\"page\"} 0.2\n\
            herald_presence_query_seconds_count{kind=\"page\"} 100\n\
            herald_presence_query_seconds_bucket{kind=\"stats\",le=\"0.001\"} 100\n\
            herald_presence_query_seconds_bucket{kind=\"stats\",le=\"+Inf\"} 100\n";
        let timings = histogram_p99(text, QUERY_SECONDS);
        assert_eq!(timings.len(), 2);
        assert_eq!(timings[0].labels, "kind=\"page\"");
        assert_eq!(
            (timings[0].count, timings[0].p99_at_most_s),
            (100, Some(0.005))
        );
        assert_eq!(timings[1].p99_at_most_s, Some(0.001));
        assert!(histogram_p99("other_metric 1\n", QUERY_SECONDS).is_empty());
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(encode("room:a.b_c-1"), "room%3Aa.b_c-1");
        assert_eq!(encode("x/y+z="), "x%2Fy%2Bz%3D");
    }
}
