//! The review side of the results model: a revision's states and their
//! transitions, and reviewers' acks and nacks. The store records them and the
//! verdict decides them; both import them from here.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::results::Timestamp;

/// The state of a revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    New,
    Testing,
    ChangesRequested,
    AwaitingReview,
    ReadyToMerge,
    Superseded,
}

impl State {
    const ALL: [State; 6] = [
        State::New,
        State::Testing,
        State::ChangesRequested,
        State::AwaitingReview,
        State::ReadyToMerge,
        State::Superseded,
    ];

    pub fn name(self) -> &'static str {
        match self {
            State::New => "new",
            State::Testing => "testing",
            State::ChangesRequested => "changes-requested",
            State::AwaitingReview => "awaiting-review",
            State::ReadyToMerge => "ready-to-merge",
            State::Superseded => "superseded",
        }
    }

    pub fn parse(s: &str) -> Option<State> {
        State::ALL.into_iter().find(|v| v.name() == s)
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One stored state change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Transition {
    pub at: Timestamp,
    pub state: State,
    pub reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReviewKind {
    Ack,
    /// An objection: changes requested.
    Nack,
}

impl ReviewKind {
    pub fn name(self) -> &'static str {
        match self {
            ReviewKind::Ack => "ack",
            ReviewKind::Nack => "nack",
        }
    }

    pub fn parse(s: &str) -> Option<ReviewKind> {
        match s {
            "ack" => Some(ReviewKind::Ack),
            "nack" => Some(ReviewKind::Nack),
            _ => None,
        }
    }
}

/// An ack or a nack. A reviewer's latest word counts: an ack after their
/// own nack withdraws it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Review {
    pub at: Timestamp,
    pub by: String,
    pub kind: ReviewKind,
    pub reason: String,
}

/// The first patch of a revision that fails a farm check its base passes,
/// found by running that check on the kernels of the revision's first k
/// patches (`phyfarm watch` bisects and records it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FirstBad {
    pub at: Timestamp,
    /// The farm check: `farm.link_flap[reset_after_link_loss]`.
    pub check: String,
    pub variant: Option<String>,
    /// Its position in the series, from 1.
    pub patch: u32,
    /// How it was found: the steps and what each gave.
    pub how: String,
}

/// The longest `how` a store keeps.
pub const MAX_FIRST_BAD_HOW: usize = 2000;
