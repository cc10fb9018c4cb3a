//! The work one mount's templates may do, shared by all of them: minijinja's fuel (about one
//! unit an instruction, and what its filters and our functions charge), the nodes visited by
//! comparisons of documents (`doc.rs`: minijinja charges a comparison by its top-level items
//! only, so two documents compared deep in a loop would cost a fuel unit per million nodes),
//! the mount's deadline, and whether anyone still waits for the answer.
//!
//! A comparison cannot fail in minijinja (`Object::custom_cmp` answers an `Ordering`), so a
//! comparison past the work left answers at once without looking and marks the work
//! [`Stop`]ped: our functions, filters and output refuse from then on, and the render fails
//! when it ends (it can only run on for the fuel left, each step cheap again).

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::Instant;

/// Why the work stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// The mount's fuel is spent.
    OutOfWork,
    /// The mount's deadline passed.
    Deadline,
    /// Nobody waits for the answer any more (the mount was dropped).
    Cancelled,
}

/// The work left of one mount's templates.
#[derive(Debug)]
pub(crate) struct Work {
    /// Fuel left for the renders still to come (minijinja's units of one instruction).
    fuel: AtomicU64,
    /// Comparison nodes visited in the render under way.
    compared: AtomicU64,
    /// The comparison nodes the render under way may visit.
    compare_limit: AtomicU64,
    deadline: Option<Instant>,
    cancelled: AtomicBool,
    stopped: AtomicU8,
}

/// How often (in comparison nodes) a comparison looks at the clock.
const CLOCK_EVERY: u64 = 1024;

impl Work {
    /// `fuel` for every template of a mount that must be answered by `deadline`.
    pub(crate) fn new(fuel: u64, deadline: Option<Instant>) -> Arc<Self> {
        Arc::new(Self {
            fuel: AtomicU64::new(fuel),
            compared: AtomicU64::new(0),
            compare_limit: AtomicU64::new(0),
            deadline,
            cancelled: AtomicBool::new(false),
            stopped: AtomicU8::new(0),
        })
    }

    /// The fuel left: what the next render may burn.
    pub(crate) fn fuel_left(&self) -> u64 {
        self.fuel.load(Ordering::Relaxed)
    }

    /// A render starts: its comparisons may visit as many nodes as there is fuel left.
    pub(crate) fn start_render(&self) {
        self.compared.store(0, Ordering::Relaxed);
        self.compare_limit
            .store(self.fuel_left(), Ordering::Relaxed);
    }

    /// A render ended having burnt `fuel` (minijinja's count); its comparisons' nodes are
    /// burnt too. Stops the work if that is more than was left.
    pub(crate) fn end_render(&self, fuel: u64) {
        let burnt = fuel.saturating_add(self.compared.swap(0, Ordering::Relaxed));
        let left = self.fuel_left();
        self.fuel
            .store(left.saturating_sub(burnt), Ordering::Relaxed);
        if burnt > left {
            self.stop(Stop::OutOfWork);
        }
    }

    /// Nobody waits for the answer: the renders stop at their next look.
    pub(crate) fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }

    /// Why the work stopped, if it did; looks at the clock and the cancellation.
    pub(crate) fn check(&self) -> Option<Stop> {
        if let Some(stop) = self.stopped() {
            return Some(stop);
        }
        if self.cancelled.load(Ordering::Relaxed) {
            self.stop(Stop::Cancelled);
        } else if self.deadline.is_some_and(|d| Instant::now() >= d) {
            self.stop(Stop::Deadline);
        }
        self.stopped()
    }

    /// Why the work stopped, without looking again.
    pub(crate) fn stopped(&self) -> Option<Stop> {
        match self.stopped.load(Ordering::Relaxed) {
            1 => Some(Stop::OutOfWork),
            2 => Some(Stop::Deadline),
            3 => Some(Stop::Cancelled),
            _ => None,
        }
    }

    fn stop(&self, why: Stop) {
        let code = match why {
            Stop::OutOfWork => 1,
            Stop::Deadline => 2,
            Stop::Cancelled => 3,
        };
        // The first reason stays.
        let _ = self
            .stopped
            .compare_exchange(0, code, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// One comparison node visited: `false` once the work is stopped (the comparison then
    /// answers without looking further).
    fn compare_step(&self) -> bool {
        let visited = self.compared.fetch_add(1, Ordering::Relaxed) + 1;
        if visited > self.compare_limit.load(Ordering::Relaxed) {
            self.stop(Stop::OutOfWork);
        }
        if visited.is_multiple_of(CLOCK_EVERY) {
            return self.check().is_none();
        }
        self.stopped().is_none()
    }
}

thread_local! {
    /// The work of the render running on this thread: minijinja's comparison hook is given
    /// no state, so the documents find their meter here (set only while `render` runs).
    static CURRENT: RefCell<Option<Arc<Work>>> = const { RefCell::new(None) };
}

/// While it lives, comparisons on this thread are charged to `work`.
pub(crate) struct Charging(());

impl Charging {
    pub(crate) fn to(work: &Arc<Work>) -> Self {
        CURRENT.with(|current| *current.borrow_mut() = Some(work.clone()));
        Charging(())
    }
}

impl Drop for Charging {
    fn drop(&mut self) {
        CURRENT.with(|current| current.borrow_mut().take());
    }
}

/// Charges one comparison node to the render running on this thread: `false` once its
/// work is stopped. Outside a render (a test comparing documents) nothing is charged.
pub(crate) fn compare_step() -> bool {
    CURRENT.with(|current| current.borrow().as_ref().is_none_or(|w| w.compare_step()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparisons_past_the_fuel_left_stop_the_work_and_the_render_pays_for_them() {
        let work = Work::new(100, None);
        work.start_render();
        {
            let _charging = Charging::to(&work);
            assert!((0..100).all(|_| compare_step()));
            assert!(!compare_step(), "the 101st node is past the fuel");
        }
        assert!(compare_step(), "outside a render nothing is charged");
        assert_eq!(work.stopped(), Some(Stop::OutOfWork));
        work.end_render(0);
        assert_eq!(work.fuel_left(), 0);
    }

    #[test]
    fn renders_share_one_fuel_and_a_deadline_or_a_cancel_stops_the_work() {
        let work = Work::new(1_000, None);
        work.start_render();
        work.end_render(600);
        assert_eq!(work.fuel_left(), 400);
        work.start_render();
        work.end_render(300);
        assert_eq!(work.fuel_left(), 100);
        assert_eq!(work.check(), None);
        work.cancel();
        assert_eq!(work.check(), Some(Stop::Cancelled));

        let past = Work::new(1_000, Some(Instant::now()));
        assert_eq!(past.check(), Some(Stop::Deadline));
    }
}
