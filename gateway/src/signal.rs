//! A one-time signal between the parts of one connection: set once, awaited
//! by any number. A flag and a `Notify` inline in an allocation the
//! connection has anyway, where a `CancellationToken` would be an allocation
//! of its own (issue #16: an idle connection's every byte counts).
//!
//! It can also be poked: a wake that does not set it, for the one waiter
//! that asks for pokes ([`Signal::wait_or_poked`]). The connection's loop
//! waits for its end and for server-side commands on the one `Notify`, so
//! that an idle connection carries no second waiter for a seldom event.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

#[derive(Default)]
pub struct Signal {
    set: AtomicBool,
    poked: AtomicBool,
    notify: Notify,
}

impl Signal {
    /// Sets the signal and wakes whoever waits for it.
    pub fn set(&self) {
        self.set.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    pub fn is_set(&self) -> bool {
        self.set.load(Ordering::Acquire)
    }

    /// Wakes [`wait_or_poked`](Self::wait_or_poked) without setting the
    /// signal; a poke while nobody waits is kept for the next wait.
    pub fn poke(&self) {
        self.poked.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// Resolves once the signal is set. The waiter is registered before the
    /// flag is read, so a signal set meanwhile is not missed; a poke wakes
    /// it only to wait again.
    pub async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_set() {
                return;
            }
            notified.await;
        }
    }

    /// Resolves with `true` once the signal is set, or with `false` for a
    /// poke (taken: the next wait does not see it again).
    pub async fn wait_or_poked(&self) -> bool {
        // Written out, as `wait` is: a shared inner `async fn` would add its
        // own state to every connection's future, twice.
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_set() {
                return true;
            }
            if self.poked.swap(false, Ordering::AcqRel) {
                return false;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    const STEP: Duration = Duration::from_secs(10);

    #[tokio::test]
    async fn a_wait_ends_when_the_signal_is_set_before_or_after_it_began() {
        let signal = Arc::new(Signal::default());
        let waiting = tokio::spawn({
            let signal = signal.clone();
            async move { signal.wait().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        signal.set();
        tokio::time::timeout(STEP, waiting)
            .await
            .expect("woken")
            .expect("joined");
        // Set already: no wait at all.
        tokio::time::timeout(STEP, signal.wait())
            .await
            .expect("at once");
        assert!(signal.is_set());
    }

    #[tokio::test]
    async fn a_poke_wakes_only_who_asks_for_pokes_and_is_taken_once() {
        let signal = Arc::new(Signal::default());
        let stopped = tokio::spawn({
            let signal = signal.clone();
            async move { signal.wait().await }
        });
        tokio::task::yield_now().await;
        signal.poke();
        // Kept for the next wait_or_poked, which takes it.
        let woken = tokio::time::timeout(STEP, signal.wait_or_poked()).await;
        assert_eq!(woken.ok(), Some(false), "a poke, not the end");
        tokio::task::yield_now().await;
        assert!(!stopped.is_finished(), "a poke does not end a wait");
        let again = futures_util::FutureExt::now_or_never(signal.wait_or_poked());
        assert_eq!(again, None, "a poke is taken once");
        signal.set();
        tokio::time::timeout(STEP, stopped)
            .await
            .expect("woken")
            .expect("joined");
        let set = tokio::time::timeout(STEP, signal.wait_or_poked()).await;
        assert_eq!(set.ok(), Some(true));
    }
}
