//! The layers of the fetch stacks the mount service is built over, one concern each: the
//! byte budget every fetch passes ([`BudgetLayer`]) and the failover region a secret is read
//! from when its primary region fails ([`FailoverLayer`]).

pub(crate) mod budget;
pub(crate) mod failover;

pub use budget::{Budget, BudgetLayer, Held, Metered, Refused};
pub use failover::{Failover, FailoverLayer, RegionStats, ServedBy, WithFailover};
