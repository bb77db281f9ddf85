//! The one list of routing policies. A policy is registered by one line here,
//! `Name module` (the first is the default): the configuration takes its
//! name (`module`) for `policy`, `prefill_policy` and `decode_policy`, and
//! `crate::policy` declares `module` and dispatches to its `Name`, which implements
//! `crate::policy::Select`. The list is a macro that hands it to another, so the
//! configuration, which imports nothing above it, names the policies without
//! naming their code.

/// Calls `$then! { Name module, ... }` with every policy.
macro_rules! policies {
    ($then:ident) => {
        $then! {
            PredictedTtft predicted_ttft,
            CacheAware cache_aware,
            RoundRobin round_robin,
            Random random,
            PowerOfTwo power_of_two,
        }
    };
}
pub(crate) use policies;

/// Declares `Policy`, one variant a policy, spelled in the configuration as its
/// module's name.
macro_rules! policy_names {
    ($first:ident $first_module:ident, $($name:ident $module:ident,)*) => {
        /// A pool's routing policy, as the configuration names it.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub enum Policy {
            #[default]
            $first,
            $($name,)*
        }

        impl Policy {
            /// Every policy, in the list's order.
            pub const ALL: &'static [Policy] = &[Policy::$first, $(Policy::$name),*];

            /// Every policy's name, in the list's order.
            pub const NAMES: &'static [&'static str] =
                &[stringify!($first_module), $(stringify!($module)),*];

            /// The name the configuration, logs and docs use.
            pub fn as_str(self) -> &'static str {
                match self {
                    Policy::$first => stringify!($first_module),
                    $(Policy::$name => stringify!($module),)*
                }
            }

            fn named(name: &str) -> Option<Policy> {
                match name {
                    stringify!($first_module) => Some(Policy::$first),
                    $(stringify!($module) => Some(Policy::$name),)*
                    _ => None,
                }
            }
        }
    };
}
policies!(policy_names);

impl<'de> serde::Deserialize<'de> for Policy {
    /// By name, refusing an unknown one as a derived enum would, naming the known.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Policy, D::Error> {
        let name = String::deserialize(d)?;
        Policy::named(&name).ok_or_else(|| serde::de::Error::unknown_variant(&name, Policy::NAMES))
    }
}
