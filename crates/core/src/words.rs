//! Configuration words: the enums people write as one word, in flags, files and APIs
//! (`--on-store-error local`, `on_missing = "skip"`, `algorithm = "gcra"`). [`words!`](crate::words)
//! declares each with its words once, and gives it `as_str`, `Display`, `FromStr` and the list of
//! its words, so every parser of a word refuses the same way: what it is, and every word it could
//! be.

use std::fmt;

/// A word that names none of an enum's variants.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {text:?}: use {}", Alternatives(words))]
pub struct UnknownWord {
    /// What the word was to name (`on_missing`, `lease mode`).
    pub what: &'static str,
    /// The word given.
    pub text: String,
    /// Every word accepted, in declaration order.
    pub words: &'static [&'static str],
}

/// `a, b or c`.
struct Alternatives(&'static [&'static str]);

impl fmt::Display for Alternatives {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, word) in self.0.iter().enumerate() {
            let separator = match i {
                0 => "",
                i if i + 1 == self.0.len() => " or ",
                _ => ", ",
            };
            write!(f, "{separator}{word}")?;
        }
        Ok(())
    }
}

/// Declares an enum of configuration words: each variant with the one word that names it.
///
/// ```
/// tollgate_core::words! {
///     /// How loud.
///     #[derive(Default)]
///     pub enum Volume: "volume" {
///         /// Quiet.
///         #[default]
///         Low = "low",
///         /// Loud.
///         High = "high",
///     }
/// }
/// assert_eq!("high".parse::<Volume>(), Ok(Volume::High));
/// assert_eq!(Volume::Low.as_str(), "low");
/// assert_eq!("max".parse::<Volume>().unwrap_err().to_string(), "volume \"max\": use low or high");
/// ```
#[macro_export]
macro_rules! words {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident: $what:literal {
            $( $(#[$variant_meta:meta])* $variant:ident = $word:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $name {
            $( $(#[$variant_meta])* $variant, )+
        }

        impl $name {
            /// Every variant, in declaration order.
            $vis const ALL: [$name; [$($word,)+].len()] = [$($name::$variant,)+];
            /// Every word, in declaration order.
            $vis const WORDS: &'static [&'static str] = &[$($word,)+];

            /// The word that names it.
            #[must_use]
            $vis const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $word,)+
                }
            }
        }

        impl ::core::fmt::Display for $name {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::core::str::FromStr for $name {
            type Err = $crate::UnknownWord;

            fn from_str(text: &str) -> ::core::result::Result<Self, $crate::UnknownWord> {
                match text {
                    $($word => Ok($name::$variant),)+
                    _ => Err($crate::UnknownWord { what: $what, text: text.to_string(), words: Self::WORDS }),
                }
            }
        }
    };
}

#[cfg(test)]
mod tests {
    crate::words! {
        /// A test enum.
        enum Three: "three" {
            /// a
            A = "a",
            /// b
            B = "b-b",
            /// c
            C = "c",
        }
    }

    #[test]
    fn every_word_round_trips_and_an_unknown_one_lists_them_all() {
        for v in Three::ALL {
            assert_eq!(v.as_str().parse::<Three>(), Ok(v));
            assert_eq!(v.to_string(), v.as_str());
        }
        assert_eq!(Three::WORDS, ["a", "b-b", "c"]);
        assert_eq!("B-B".parse::<Three>().unwrap_err().to_string(), "three \"B-B\": use a, b-b or c");
    }
}
