//! The two update slots.
//!
//! A node has exactly two slots; everything that names one uses [`Slot`], never a string.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// One of the two A/B slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Slot {
    /// The first slot.
    A,
    /// The second slot.
    B,
}

impl Slot {
    /// Both slots, A first.
    pub const ALL: [Slot; 2] = [Slot::A, Slot::B];

    /// The other slot.
    pub fn other(self) -> Slot {
        match self {
            Slot::A => Slot::B,
            Slot::B => Slot::A,
        }
    }

    /// Upper-case letter used in bootloader variables and labels (`A`, `B`).
    pub fn letter(self) -> &'static str {
        match self {
            Slot::A => "A",
            Slot::B => "B",
        }
    }

    /// Lower-case name used in file and partition names (`a`, `b`).
    pub fn lower(self) -> &'static str {
        match self {
            Slot::A => "a",
            Slot::B => "b",
        }
    }
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.letter())
    }
}

/// A string that names no slot.
#[derive(Debug, thiserror::Error)]
#[error("'{0}' is not a slot: expected A or B")]
pub struct ParseSlotError(pub String);

impl FromStr for Slot {
    type Err = ParseSlotError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "A" | "a" => Ok(Slot::A),
            "B" | "b" => Ok(Slot::B),
            other => Err(ParseSlotError(other.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_is_an_involution() {
        for s in Slot::ALL {
            assert_ne!(s, s.other());
            assert_eq!(s, s.other().other());
        }
    }

    #[test]
    fn parse_round_trip_and_reject() {
        assert_eq!("b".parse::<Slot>().unwrap(), Slot::B);
        assert_eq!(Slot::A.to_string().parse::<Slot>().unwrap(), Slot::A);
        let e = "C".parse::<Slot>().unwrap_err();
        assert!(e.to_string().contains("'C'"));
    }
}
