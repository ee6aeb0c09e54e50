//! Which pod the next connection goes to.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::Error;

/// How long [`Urls`] leaves out a URL that refused a connection (about as
/// long as a Service takes to drop a dead pod's endpoint).
pub const DOWN_FOR: Duration = Duration::from_secs(2);

/// Picks where each connection goes. Any pod will do: the session is
/// resumable on every pod of a cluster.
pub trait Endpoints: Send + Sync + 'static {
    /// The URL for the next attempt (`previous`: the one the last
    /// connection used); `None` while there is none (the client backs off
    /// and asks again).
    fn pick(&self, previous: Option<&str>) -> Option<String>;

    /// Nothing listened at `url` (the pod is gone): a hint to leave it out
    /// for a while.
    fn refused(&self, _url: &str) {}
}

/// A fixed list of URLs, tried in turn from the first: each attempt takes
/// the next one, skipping those that refused a connection in the last
/// [`DOWN_FOR`] (unless all did).
#[derive(Debug)]
pub struct Urls {
    urls: Vec<String>,
    next: AtomicUsize,
    down_until: Mutex<Vec<Option<Instant>>>,
}

impl Urls {
    /// Checks that each is a `ws://` URL with a host.
    pub fn new<I, S>(urls: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let urls: Vec<String> = urls.into_iter().map(Into::into).collect();
        if urls.is_empty() {
            return Err(Error::Url {
                url: String::new(),
                reason: "no URL given".to_owned(),
            });
        }
        for url in &urls {
            crate::wire::host_port(url)?;
        }
        let down_until = Mutex::new(vec![None; urls.len()]);
        Ok(Self {
            urls,
            next: AtomicUsize::new(0),
            down_until,
        })
    }
}

impl Endpoints for Urls {
    fn pick(&self, _previous: Option<&str>) -> Option<String> {
        let now = Instant::now();
        let down = self
            .down_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let start = self.next.load(Ordering::Relaxed);
        let n = self.urls.len();
        let pick = (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| down[i].is_none_or(|until| until <= now))
            .unwrap_or(start % n);
        self.next.store(pick + 1, Ordering::Relaxed);
        self.urls.get(pick).cloned()
    }

    fn refused(&self, url: &str) {
        let mut down = self
            .down_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (i, u) in self.urls.iter().enumerate() {
            if u == url {
                down[i] = Some(Instant::now() + DOWN_FOR);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn urls_rotate_and_skip_one_that_refused() {
        let urls = Urls::new(["ws://a:1/ws", "ws://b:1/ws", "ws://c:1/ws"])
            .unwrap_or_else(|e| panic!("{e}"));
        let picks: Vec<_> = (0..4).filter_map(|_| urls.pick(None)).collect();
        assert_eq!(
            picks,
            ["ws://a:1/ws", "ws://b:1/ws", "ws://c:1/ws", "ws://a:1/ws"]
        );
        urls.refused("ws://b:1/ws");
        let picks: Vec<_> = (0..3).filter_map(|_| urls.pick(None)).collect();
        assert_eq!(picks, ["ws://c:1/ws", "ws://a:1/ws", "ws://c:1/ws"]);
        assert!(Urls::new(["http://a/ws"]).is_err());
        assert!(Urls::new(Vec::<String>::new()).is_err());
    }
}
