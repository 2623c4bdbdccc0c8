//! MDIO fault injection: chosen PHY register reads or writes fail (the
//! ASIX vendor request STALLs, as when the chip's MDIO access times out),
//! once, N times or with a probability, reproducibly from a seed.

use serde::{Deserialize, Serialize};

use crate::impair::Rng;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MdioOp {
    Read,
    Write,
    #[default]
    Both,
}

/// One rule: which accesses fail, how often.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MdioRule {
    #[serde(default)]
    pub op: MdioOp,
    /// Registers (0..31) the rule covers; empty: all of them.
    #[serde(default)]
    pub regs: Vec<u8>,
    /// Failures left (`None`: no limit).
    #[serde(default)]
    pub count: Option<u64>,
    /// Chance that a covered access fails.
    #[serde(default = "one")]
    pub probability: f64,
    #[serde(default)]
    pub seed: u64,
    /// Failures injected by this rule so far.
    #[serde(default)]
    pub injected: u64,
    #[serde(skip)]
    rng: Option<Rng>,
}

fn one() -> f64 {
    1.0
}

impl MdioRule {
    pub fn new(
        op: MdioOp,
        regs: Vec<u8>,
        count: Option<u64>,
        probability: f64,
        seed: u64,
    ) -> MdioRule {
        MdioRule {
            op,
            regs,
            count,
            probability,
            seed,
            injected: 0,
            rng: Some(Rng::new(seed)),
        }
    }

    /// Check the rule's values; the error names what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.probability) {
            return Err(format!("probability {} is not in [0, 1]", self.probability));
        }
        if self.regs.len() > MAX_REGS {
            return Err(format!(
                "regs lists {} registers; at most {MAX_REGS}",
                self.regs.len()
            ));
        }
        if let Some(r) = self.regs.iter().find(|r| **r > 31) {
            return Err(format!(
                "regs: register {r} is not a clause-22 register (0..31)"
            ));
        }
        if let Some(n) = self.count.filter(|n| *n > MAX_COUNT) {
            return Err(format!("count {n} must be at most {MAX_COUNT}"));
        }
        Ok(())
    }

    fn covers(&self, write: bool, reg: u8) -> bool {
        let op = match self.op {
            MdioOp::Both => true,
            MdioOp::Read => !write,
            MdioOp::Write => write,
        };
        op && (self.regs.is_empty() || self.regs.contains(&reg)) && self.count != Some(0)
    }

    fn fires(&mut self, write: bool, reg: u8) -> bool {
        if !self.covers(write, reg) {
            return false;
        }
        let seed = self.seed;
        let rng = self.rng.get_or_insert_with(|| Rng::new(seed));
        if self.probability < 1.0 && rng.unit() >= self.probability {
            return false;
        }
        if let Some(n) = &mut self.count {
            *n -= 1;
        }
        self.injected += 1;
        true
    }
}

/// The rules in force.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MdioFaults {
    pub rules: Vec<MdioRule>,
    pub injected: u64,
}

/// Rules held at once.
pub const MAX_RULES: usize = 32;
/// Registers one rule lists, at most (each of the 32 once).
pub const MAX_REGS: usize = 32;
/// Largest `count` of one rule.
pub const MAX_COUNT: u64 = 1_000_000;

impl MdioFaults {
    pub fn add(&mut self, r: MdioRule) -> Result<(), String> {
        r.validate()?;
        if self.rules.len() >= MAX_RULES {
            return Err(format!(
                "at most {MAX_RULES} MDIO fault rules; clear some first"
            ));
        }
        self.rules.push(r);
        Ok(())
    }

    pub fn clear(&mut self) {
        self.rules.clear();
    }

    /// Whether this access fails. Every rule that covers it is consulted
    /// in order; the first that fires decides.
    pub fn fires(&mut self, write: bool, reg: u8) -> bool {
        let hit = self.rules.iter_mut().any(|r| r.fires(write, reg));
        self.injected += u64::from(hit);
        hit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_n_times_and_per_register() {
        let mut f = MdioFaults::default();
        f.add(MdioRule::new(MdioOp::Read, vec![1], Some(1), 1.0, 0))
            .unwrap();
        f.add(MdioRule::new(MdioOp::Write, vec![], Some(2), 1.0, 0))
            .unwrap();
        assert!(!f.fires(false, 0), "other register");
        assert!(f.fires(false, 1), "once");
        assert!(!f.fires(false, 1), "only once");
        assert!(f.fires(true, 4));
        assert!(f.fires(true, 0));
        assert!(!f.fires(true, 4), "twice, then done");
        assert_eq!(f.injected, 3);
        assert_eq!((f.rules[0].injected, f.rules[1].injected), (1, 2));
        assert_eq!(f.rules[1].count, Some(0));
        f.add(MdioRule::new(MdioOp::Read, vec![31], None, 1.0, 0))
            .unwrap();
        assert!(f.fires(false, 31), "register 31 exists");
        f.clear();
        assert!(!f.fires(false, 1));
    }

    #[test]
    fn probability_is_reproducible_from_the_seed() {
        let run = |seed| {
            let mut f = MdioFaults::default();
            f.add(MdioRule::new(MdioOp::Both, vec![], None, 0.25, seed))
                .unwrap();
            (0..400).map(|i| f.fires(i % 2 == 0, 1)).collect::<Vec<_>>()
        };
        assert_eq!(run(3), run(3));
        assert_ne!(run(3), run(4));
        let n = run(3).iter().filter(|x| **x).count();
        assert!((60..140).contains(&n), "{n} of 400 at p=0.25");
    }

    #[test]
    fn a_rule_without_probability_always_fires() {
        let r: MdioRule = serde_json::from_str(r#"{"regs":[1]}"#).unwrap();
        assert_eq!((r.probability, r.op, r.count), (1.0, MdioOp::Both, None));
        let mut f = MdioFaults::default();
        f.add(r).unwrap();
        assert!((0..50).all(|_| f.fires(false, 1)));
    }

    #[test]
    fn bad_rules_are_refused() {
        let mut f = MdioFaults::default();
        assert!(f
            .add(MdioRule::new(MdioOp::Both, vec![32], None, 1.0, 0))
            .is_err());
        assert!(f
            .add(MdioRule::new(MdioOp::Both, vec![], None, 1.5, 0))
            .is_err());
        let e = f
            .add(MdioRule::new(
                MdioOp::Both,
                vec![],
                Some(MAX_COUNT + 1),
                1.0,
                0,
            ))
            .unwrap_err();
        assert_eq!(e, "count 1000001 must be at most 1000000");
        let e = f
            .add(MdioRule::new(
                MdioOp::Both,
                vec![1; MAX_REGS + 1],
                None,
                1.0,
                0,
            ))
            .unwrap_err();
        assert!(e.starts_with("regs"), "{e}");
        assert!(f.rules.is_empty(), "nothing refused was kept");
        for _ in 0..MAX_RULES {
            f.add(MdioRule::new(MdioOp::Both, vec![], None, 1.0, 0))
                .unwrap();
        }
        assert!(f
            .add(MdioRule::new(MdioOp::Both, vec![], None, 1.0, 0))
            .is_err());
    }
}
