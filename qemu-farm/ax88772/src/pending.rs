//! Transfers waiting for completion, in order, with O(1) cancel by id.
//!
//! A cancel only forgets the id; the queue skips forgotten entries when
//! they reach its front and compacts itself when they outnumber the live
//! ones, so a peer that submits and cancels forever costs neither time nor
//! memory.

use std::collections::{HashMap, VecDeque};

#[derive(Debug)]
pub struct Pending<T> {
    queue: VecDeque<(u64, u64, T)>,
    live: HashMap<u64, u64>,
    seq: u64,
    cap: usize,
}

/// Why [`Pending::push`] refused a transfer.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    Full,
    DuplicateId,
}

impl<T> Pending<T> {
    pub fn new(cap: usize) -> Pending<T> {
        Pending {
            queue: VecDeque::new(),
            live: HashMap::new(),
            seq: 0,
            cap,
        }
    }

    pub fn len(&self) -> usize {
        self.live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    pub fn contains(&self, id: u64) -> bool {
        self.live.contains_key(&id)
    }

    pub fn is_full(&self) -> bool {
        self.live.len() >= self.cap
    }

    pub fn push(&mut self, id: u64, v: T) -> Result<(), Refused> {
        if self.is_full() {
            return Err(Refused::Full);
        }
        if self.live.contains_key(&id) {
            return Err(Refused::DuplicateId);
        }
        self.seq += 1;
        self.live.insert(id, self.seq);
        self.queue.push_back((id, self.seq, v));
        Ok(())
    }

    fn skip_dead(&mut self) {
        while let Some((id, seq, _)) = self.queue.front() {
            if self.live.get(id) == Some(seq) {
                return;
            }
            self.queue.pop_front();
        }
    }

    /// The oldest live transfer.
    pub fn front(&mut self) -> Option<(u64, &T)> {
        self.skip_dead();
        self.queue.front().map(|(id, _, v)| (*id, v))
    }

    pub fn pop_front(&mut self) -> Option<(u64, T)> {
        self.skip_dead();
        let (id, _, v) = self.queue.pop_front()?;
        self.live.remove(&id);
        Some((id, v))
    }

    /// Forget a transfer; true when it was pending.
    pub fn cancel(&mut self, id: u64) -> bool {
        if self.live.remove(&id).is_none() {
            return false;
        }
        if self.queue.len() > 2 * self.live.len() + 64 {
            let live = &self.live;
            self.queue.retain(|(id, seq, _)| live.get(id) == Some(seq));
        }
        true
    }

    /// Take a transfer out wherever it is, value and all: O(n) in the
    /// entries held, for short queues whose values must not outlive a
    /// cancel (bulk OUT data).
    pub fn remove(&mut self, id: u64) -> Option<T> {
        let seq = self.live.remove(&id)?;
        let at = self
            .queue
            .iter()
            .position(|(i, s, _)| *i == id && *s == seq)?;
        self.queue.remove(at).map(|(_, _, v)| v)
    }

    /// Every live transfer, oldest first; the queue is left empty.
    pub fn drain(&mut self) -> Vec<(u64, T)> {
        let live = std::mem::take(&mut self.live);
        std::mem::take(&mut self.queue)
            .into_iter()
            .filter(|(id, seq, _)| live.get(id) == Some(seq))
            .map(|(id, _, v)| (id, v))
            .collect()
    }

    /// Entries held, cancelled ones included (for bounds in tests).
    pub fn held(&self) -> usize {
        self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancelled_entries_are_compacted_once_they_outnumber_the_live() {
        let mut p = Pending::new(1000);
        for id in 0..300 {
            p.push(id, ()).unwrap();
        }
        // 100 dead among 200 live: not worth a pass over the queue yet.
        for id in 0..100 {
            assert!(p.cancel(id));
        }
        assert_eq!(p.queue.len(), 300);
        // Past twice the live ones (plus slack), the dead are dropped.
        for id in 100..290 {
            assert!(p.cancel(id));
            assert!(p.queue.len() <= 2 * p.live.len() + 64, "{}", p.queue.len());
        }
        assert_eq!(p.live.len(), 10);
        assert!(p.queue.len() < 300);
        let left: Vec<u64> = p.drain().into_iter().map(|(id, _)| id).collect();
        assert_eq!(left, (290..300).collect::<Vec<_>>());
    }

    #[test]
    fn order_cancel_and_bounds() {
        let mut p = Pending::new(3);
        p.push(10, 'a').unwrap();
        p.push(11, 'b').unwrap();
        assert_eq!(p.push(10, 'x'), Err(Refused::DuplicateId));
        p.push(12, 'c').unwrap();
        assert_eq!(p.push(13, 'd'), Err(Refused::Full));
        assert!(p.cancel(10));
        assert!(!p.cancel(10), "a second cancel finds nothing");
        assert!(!p.cancel(99));
        assert_eq!(p.len(), 2);
        assert_eq!(p.front(), Some((11, &'b')));
        // The id of a cancelled transfer may come back.
        p.push(10, 'e').unwrap();
        assert_eq!(p.pop_front(), Some((11, 'b')));
        assert_eq!(p.drain(), vec![(12, 'c'), (10, 'e')]);
        assert!(p.is_empty());
        assert_eq!(p.pop_front(), None);
    }

    #[test]
    fn remove_takes_the_value_out_and_leaves_nothing_behind() {
        let mut p = Pending::new(8);
        for id in 1..=3 {
            p.push(id, vec![id as u8; 100]).unwrap();
        }
        assert_eq!(p.remove(2), Some(vec![2; 100]));
        assert_eq!(p.remove(2), None);
        assert_eq!(p.remove(9), None);
        assert_eq!((p.len(), p.held()), (2, 2));
        assert_eq!(p.pop_front(), Some((1, vec![1; 100])));
        assert_eq!(p.front(), Some((3, &vec![3; 100])));
    }

    #[test]
    fn an_id_cancelled_in_the_middle_can_come_back() {
        let mut p = Pending::new(8);
        assert!(p.is_empty());
        for id in 1..=3 {
            p.push(id, id * 10).unwrap();
        }
        assert!(!p.is_empty());
        assert!(p.cancel(2));
        p.push(2, 99).unwrap();
        assert_eq!(p.len(), 3);
        assert_eq!(p.drain(), vec![(1, 10), (3, 30), (2, 99)]);
    }

    #[test]
    fn cancelled_entries_never_outnumber_twice_the_live_ones_plus_64() {
        let mut p = Pending::new(4096);
        for id in 0..10 {
            p.push(id, ()).unwrap();
        }
        for id in 100..5000u64 {
            p.push(id, ()).unwrap();
            assert!(p.cancel(id));
            assert!(p.held() >= p.len());
            assert!(p.held() <= 2 * 10 + 64 + 1, "held {}", p.held());
        }
        assert_eq!(p.len(), 10);
    }

    #[test]
    fn submit_and_cancel_forever_stays_small() {
        let mut p = Pending::new(1024);
        p.push(0, ()).unwrap();
        for id in 1..100_000u64 {
            p.push(id, ()).unwrap();
            assert!(p.cancel(id));
        }
        assert_eq!(p.len(), 1);
        let live = p.len();
        assert!(p.held() <= 2 * live + 64 + 1, "held {}", p.held());
        assert_eq!(p.pop_front(), Some((0, ())));
    }
}
