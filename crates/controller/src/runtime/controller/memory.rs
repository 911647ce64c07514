//! What the runtime remembers about each set between its reconciles (our own recent actions and
//! their outcomes, never the cluster's state), and when each entry is forgotten: once it holds
//! nothing, and when its set is gone (but for its pending withdrawals).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::ResourceExt;

use crate::runtime::leader::Tenure;
use crate::set_kind::SetKind;

/// One set's memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct SetMemory {
    /// Failed reconciles in a row ([`next_failure`]).
    pub(super) failures: Option<Failures>,
    /// The last live read before a drain pod's create did not confirm it (it failed, or showed
    /// the ordinal back in range): creates wait for the read until one confirms
    /// ([`Cluster::confirm_first`]).
    pub(super) unconfirmed: bool,
    /// Drain pods whose withdrawal failed: UID → the pod's name and the tenure of the Lease it
    /// was created in ([`Cluster::withdraw_later`]). Carried out in that tenure only: after
    /// another, another replica may have found the pod, recorded it and let its drain run, so
    /// a replica that leads again judges it on its merits, as after a restart.
    pub(super) withdrawing: BTreeMap<String, Withdrawal>,
    /// Pods made neither by the set nor by us that hold an ordinal's name: ordinal → UID
    /// ([`Cluster::name_taken`]); read again at each reconcile ([`recheck_taken`]).
    pub(super) taken: BTreeMap<i32, String>,
    /// Under `--dry-run`: a fingerprint of the Events last published, so an unchanged plan is
    /// not reported again.
    pub(super) dry_run_reported: Option<u64>,
    /// Failed writes of the status in a row (its retry's backoff).
    pub(super) status_failures: u32,
}

impl SetMemory {
    /// What is kept of a set that is gone: its pending withdrawals only. After `kubectl delete
    /// sts --cascade=orphan` the drain pod outlives its set, and the set recreated under the name
    /// withdraws it at its first reconcile in the same tenure (by UID), where nothing else would
    /// (it is not the new set's drain pod, and holds the name of one of its pods).
    fn after_set_gone(self) -> Self {
        Self {
            withdrawing: self.withdrawing,
            ..Self::default()
        }
    }
}

/// Every set's memory, behind one lock (held only to read or change one entry, never across an
/// await).
#[derive(Debug, Default)]
pub(super) struct Memory(Mutex<HashMap<SetId, SetMemory>>);

impl Memory {
    /// Reads a set's memory (empty if there is none).
    pub(super) fn read<R>(&self, id: &SetId, f: impl FnOnce(&SetMemory) -> R) -> R {
        let sets = self.0.lock().expect("memory lock");
        match sets.get(id) {
            Some(memory) => f(memory),
            None => f(&SetMemory::default()),
        }
    }

    /// Changes a set's memory; an entry left holding nothing is dropped.
    pub(super) fn update<R>(&self, id: &SetId, f: impl FnOnce(&mut SetMemory) -> R) -> R {
        let mut sets = self.0.lock().expect("memory lock");
        let memory = sets.entry(id.clone()).or_default();
        let out = f(memory);
        if *memory == SetMemory::default() {
            sets.remove(id);
        }
        out
    }

    /// Forgets the sets `exists` says are gone, keeping only their pending withdrawals.
    pub(super) fn forget_gone(&self, exists: impl Fn(&SetId) -> bool) {
        let mut sets = self.0.lock().expect("memory lock");
        let gone: Vec<SetId> = sets.keys().filter(|id| !exists(id)).cloned().collect();
        for id in gone {
            let kept = sets.remove(&id).unwrap_or_default().after_set_gone();
            if kept != SetMemory::default() {
                sets.insert(id, kept);
            }
        }
    }

    /// How many sets have an entry.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.0.lock().expect("memory lock").len()
    }
}

/// A drain pod to withdraw ([`SetMemory::withdrawing`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Withdrawal {
    /// The pod's name.
    pub(super) name: String,
    /// The tenure its create was sent in ([`Leadership::fence`]).
    ///
    /// [`Leadership::fence`]: crate::runtime::leader::Leadership::fence
    pub(super) tenure: Tenure,
}

impl SetMemory {
    /// The withdrawals of `tenure`, having dropped those of any other.
    pub(super) fn withdrawals_of(&mut self, tenure: Tenure) -> BTreeMap<String, Withdrawal> {
        self.withdrawing.retain(|_, w| w.tenure == tenure);
        self.withdrawing.clone()
    }
}

/// A set's failed reconciles in a row, and when the retry the last one scheduled is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failures {
    /// Failures counted toward the backoff.
    pub(super) count: u32,
    /// When the scheduled retry is due.
    pub(super) retry_at: std::time::Instant,
}

/// A set's identity for per-set bookkeeping: its kind, namespace and name.
pub(super) type SetId = (SetKind, String, String);

pub(super) fn set_id(kind: SetKind, set: &StatefulSet) -> SetId {
    (kind, set.namespace().unwrap_or_default(), set.name_any())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::set_kind::SetKind;

    fn id(name: &str) -> SetId {
        (SetKind::StatefulSet, "ns".to_owned(), name.to_owned())
    }

    fn tenure(n: u64) -> Tenure {
        Tenure::for_tests(n)
    }

    fn withdrawal(name: &str, n: u64) -> Withdrawal {
        Withdrawal {
            name: name.to_owned(),
            tenure: tenure(n),
        }
    }

    #[test]
    fn a_withdrawal_is_carried_out_only_in_the_tenure_it_was_asked_in() {
        let memory = Memory::default();
        memory.update(&id("web"), |m| {
            m.withdrawing
                .insert("old".to_owned(), withdrawal("web-2", 1));
            m.withdrawing
                .insert("new".to_owned(), withdrawal("web-1", 2));
        });
        let now = memory.update(&id("web"), |m| m.withdrawals_of(tenure(2)));
        assert_eq!(now.keys().collect::<Vec<_>>(), ["new"]);
        // The other tenure's is forgotten, not kept for later.
        assert_eq!(memory.read(&id("web"), |m| m.withdrawing.len()), 1);
        // A tenure after both: nothing left, and the entry that holds nothing is dropped.
        assert!(
            memory
                .update(&id("web"), |m| m.withdrawals_of(tenure(3)))
                .is_empty()
        );
        assert_eq!(memory.len(), 0);
    }

    #[test]
    fn an_entry_that_holds_nothing_is_dropped() {
        let memory = Memory::default();
        memory.update(&id("web"), |m| m.unconfirmed = true);
        assert_eq!(memory.len(), 1);
        memory.update(&id("web"), |m| m.unconfirmed = false);
        assert_eq!(memory.len(), 0);
        // Reading creates nothing.
        assert!(!memory.read(&id("db"), |m| m.unconfirmed));
        assert_eq!(memory.len(), 0);
    }

    #[test]
    fn a_gone_set_keeps_only_its_pending_withdrawals() {
        let memory = Memory::default();
        memory.update(&id("web"), |m| {
            m.unconfirmed = true;
            m.dry_run_reported = Some(7);
            m.taken.insert(2, "uid".to_owned());
            m.withdrawing
                .insert("pod-uid".to_owned(), withdrawal("web-2", 1));
        });
        memory.update(&id("db"), |m| m.unconfirmed = true);
        memory.update(&id("kept"), |m| m.unconfirmed = true);
        memory.forget_gone(|i| i.2 == "kept");
        assert_eq!(
            memory.read(&id("web"), Clone::clone),
            SetMemory {
                withdrawing: BTreeMap::from([("pod-uid".to_owned(), withdrawal("web-2", 1))]),
                ..SetMemory::default()
            }
        );
        assert_eq!(memory.read(&id("db"), Clone::clone), SetMemory::default());
        assert!(memory.read(&id("kept"), |m| m.unconfirmed));
        assert_eq!(memory.len(), 2);
    }
}
