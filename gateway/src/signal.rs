//! A one-time signal between the parts of one connection: set once, awaited
//! by any number. A flag and a `Notify` inline in an allocation the
//! connection has anyway, where a `CancellationToken` would be an allocation
//! of its own (issue #16: an idle connection's every byte counts).

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

#[derive(Default)]
pub struct Signal {
    set: AtomicBool,
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

    /// Resolves once the signal is set. The waiter is registered before the
    /// flag is read, so a signal set meanwhile is not missed.
    pub async fn wait(&self) {
        let notified = self.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if !self.is_set() {
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
}
