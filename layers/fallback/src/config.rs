//! The settings of one fallback layer, shared by its services and their futures.

use crate::rule::Safety;
use std::fmt;
use std::time::Duration;

#[derive(Clone)]
pub(crate) struct Config<T, C, H> {
    /// The secondary, cloned for each request that goes there.
    pub(crate) secondary: T,
    pub(crate) safety: Safety,
    /// The deadline of the whole operation, primary and secondary, when the layer sets one.
    pub(crate) deadline: Option<Duration>,
    pub(crate) classifier: C,
    pub(crate) hook: H,
}

impl<T, C, H> fmt::Debug for Config<T, C, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("secondary", &std::any::type_name::<T>())
            .field("safety", &self.safety)
            .field("deadline", &self.deadline)
            .field("classifier", &std::any::type_name::<C>())
            .field("hook", &std::any::type_name::<H>())
            .finish()
    }
}
