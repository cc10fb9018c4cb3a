//! A string field whose length is checked as it is read.

use std::fmt;
use std::ops::Deref;

use serde::de::{self, Deserialize, Deserializer, Visitor};

/// A string of at most `MAX` bytes, refused while the document is read (before the rest of
/// it is built) when it is longer. Scalars of other types (numbers, booleans) are refused
/// too: the field is text.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct BoundedString<const MAX: usize>(String);

impl<const MAX: usize> BoundedString<MAX> {
    /// The string.
    pub fn into_inner(self) -> String {
        self.0
    }

    /// The string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<const MAX: usize> Deref for BoundedString<MAX> {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl<const MAX: usize> fmt::Debug for BoundedString<MAX> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&crate::quote(&self.0), f)
    }
}

impl<'de, const MAX: usize> Deserialize<'de> for BoundedString<MAX> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V<const MAX: usize>;
        impl<const MAX: usize> Visitor<'_> for V<MAX> {
            type Value = BoundedString<MAX>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a string of at most {MAX} bytes")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                if v.len() > MAX {
                    return Err(E::custom(format_args!(
                        "a string of {} bytes, longer than the {MAX} this field takes",
                        v.len()
                    )));
                }
                Ok(BoundedString(v.to_owned()))
            }

            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                if v.len() > MAX {
                    return self.visit_str(&v);
                }
                Ok(BoundedString(v))
            }

            // YAML reads an empty value (`name:`) as null: an empty string, as Go does.
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(BoundedString(String::new()))
            }
        }
        deserializer.deserialize_str(V::<MAX>)
    }
}
