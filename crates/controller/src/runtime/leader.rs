//! Leader election (`--leader-elect`): the Lease is held by [`kube_lease_manager`]; this module
//! adds the *fence*, checked right before every write. A replica acts only while the manager
//! says it holds the Lease and its own watch of the Lease names it, renewed less than
//! `renew_deadline` ago by its clock; another replica takes it only `lease_duration` after the
//! last renew, so no two act at once within that margin. Gaining the Lease reconciles every set.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use tokio::task::JoinHandle;
use tracing::{info, warn};

/// How to elect a leader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElectionConfig {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub lease_name: String,
    /// This replica's identity (unique among the replicas: the pod name).
    pub identity: String,
    /// How long a Lease stays valid after its last renew, for the other replicas.
    pub lease_duration: Duration,
    /// How long after its last renew the holder stops acting (`< lease_duration`).
    pub renew_deadline: Duration,
    /// How often the holder renews (`< renew_deadline`).
    pub retry_period: Duration,
}

/// Why an election configuration is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// The durations are not ordered `retry_period < renew_deadline < lease_duration`.
    #[error(
        "leader election needs retry period ({retry:?}) < renew deadline ({renew:?}) < lease duration ({lease:?})"
    )]
    Durations {
        /// Retry period.
        retry: Duration,
        /// Renew deadline.
        renew: Duration,
        /// Lease duration.
        lease: Duration,
    },
    /// The lease manager counts whole seconds.
    #[error("leader election durations must be whole seconds of at least 1 s (got {0:?})")]
    NotWholeSeconds(Duration),
    /// No identity.
    #[error("leader election needs an identity (--leader-elect-identity, or POD_NAME)")]
    NoIdentity,
}

impl ElectionConfig {
    /// Checks the durations and identity.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.identity.is_empty() {
            return Err(ConfigError::NoIdentity);
        }
        for d in [self.lease_duration, self.retry_period] {
            if d.subsec_nanos() != 0 || d.is_zero() {
                return Err(ConfigError::NotWholeSeconds(d));
            }
        }
        if !(self.retry_period < self.renew_deadline && self.renew_deadline < self.lease_duration) {
            return Err(ConfigError::Durations {
                retry: self.retry_period,
                renew: self.renew_deadline,
                lease: self.lease_duration,
            });
        }
        Ok(())
    }

    /// The lease manager's grace: it renews this long before the Lease expires, so once per
    /// retry period.
    fn grace_seconds(&self) -> u64 {
        (self.lease_duration - self.retry_period).as_secs()
    }
}

/// What the fence knows of the Lease, from this replica's watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseView {
    /// `spec.holderIdentity`.
    pub holder: Option<String>,
    /// `spec.renewTime`.
    pub renewed: Option<SystemTime>,
    /// `spec.acquireTime`: set with the holder each time a replica takes the Lease, kept
    /// while it renews.
    pub acquired: Option<SystemTime>,
}

impl LeaseView {
    fn of(lease: &Lease) -> Self {
        let spec = lease.spec.as_ref();
        Self {
            holder: spec.and_then(|s| s.holder_identity.clone()),
            renewed: spec
                .and_then(|s| s.renew_time.as_ref())
                .map(|t| SystemTime::from(t.0)),
            acquired: spec
                .and_then(|s| s.acquire_time.as_ref())
                .map(|t| SystemTime::from(t.0)),
        }
    }
}

/// The fence, a pure function: whether `identity` may act at `now`, given what the lease
/// manager reports (`holds`) and the Lease as last seen. Missing data means no.
pub fn may_act(
    holds: bool,
    lease: Option<&LeaseView>,
    identity: &str,
    renew_deadline: Duration,
    now: SystemTime,
) -> bool {
    let Some(lease) = lease else { return false };
    let Some(renewed) = lease.renewed else {
        return false;
    };
    holds
        && lease.holder.as_deref() == Some(identity)
        && renewed
            .checked_add(renew_deadline)
            .is_some_and(|until| now < until)
}

/// One holding of the Lease by this replica: from the time it took the Lease to the time it
/// loses it (the Lease's `acquireTime`; one tenure without election). Its fence may close
/// and open again within one tenure (a renew seen late), but no other replica can have acted
/// in between; after another tenure, another replica may have. See [`Leadership::fence`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tenure(Option<SystemTime>);

impl Tenure {
    /// The tenure of a Lease acquired `n` seconds after the epoch: for tests.
    #[cfg(test)]
    pub fn for_tests(n: u64) -> Self {
        Self(Some(SystemTime::UNIX_EPOCH + Duration::from_secs(n)))
    }
}

/// The fence and the tenure, a pure function: the tenure in which `identity` may act at
/// `now` ([`may_act`]), or `None` if it may not.
pub fn tenure(
    holds: bool,
    lease: Option<&LeaseView>,
    identity: &str,
    renew_deadline: Duration,
    now: SystemTime,
) -> Option<Tenure> {
    may_act(holds, lease, identity, renew_deadline, now)
        .then(|| Tenure(lease.and_then(|l| l.acquired)))
}

/// The fence's inputs.
#[derive(Debug, Default)]
struct Inputs {
    holds: bool,
    lease: Option<LeaseView>,
}

#[derive(Debug)]
struct Shared {
    identity: String,
    renew_deadline: Duration,
    inputs: Mutex<Inputs>,
    /// Wakes the supervisor when an input changed.
    changed: tokio::sync::Notify,
    /// Counts the times this replica became the leader.
    gained: tokio::sync::watch::Sender<u64>,
}

/// Whether this replica may act: always (no election), or while it leads.
#[derive(Clone, Debug, Default)]
pub struct Leadership {
    shared: Option<Arc<Shared>>,
}

impl Leadership {
    /// A replica that always acts (no leader election).
    pub fn always() -> Self {
        Self::default()
    }

    /// A replica that never acts (elected, but it never holds the lease): for tests.
    #[cfg(test)]
    pub fn standby_for_tests() -> Self {
        let (gained, _) = tokio::sync::watch::channel(0u64);
        Self {
            shared: Some(Arc::new(Shared {
                identity: "standby".to_owned(),
                renew_deadline: Duration::from_secs(1),
                inputs: Mutex::default(),
                changed: tokio::sync::Notify::new(),
                gained,
            })),
        }
    }

    /// The tenure in which this replica may act now, or `None` if it may not: the fence and
    /// the Lease it rests on, read together. What a replica remembers of its own acts can be
    /// trusted within one tenure; after another, another replica may have acted.
    pub fn fence(&self) -> Option<Tenure> {
        let Some(s) = &self.shared else {
            return Some(Tenure::default());
        };
        let inputs = s.inputs.lock().expect("leadership lock");
        tenure(
            inputs.holds,
            inputs.lease.as_ref(),
            &s.identity,
            s.renew_deadline,
            SystemTime::now(),
        )
    }

    /// Whether leader election is on.
    pub fn elected(&self) -> bool {
        self.shared.is_some()
    }

    /// Yields once each time this replica becomes the leader (never without election).
    pub fn gained(&self) -> impl Stream<Item = ()> + Send + 'static {
        let rx = self.shared.as_ref().map(|s| s.gained.subscribe());
        futures::stream::unfold(rx, |rx| async move {
            let mut rx = rx?;
            rx.changed().await.ok()?;
            Some(((), Some(rx)))
        })
    }

    fn update(&self, f: impl FnOnce(&mut Inputs)) {
        if let Some(s) = &self.shared {
            f(&mut s.inputs.lock().expect("leadership lock"));
            s.changed.notify_one();
        }
    }
}

/// Why the election could not start.
#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The lease manager could not be set up (e.g. the Lease could not be created: RBAC).
    #[error("failed to set up the Lease {namespace}/{name}")]
    Setup {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Cause.
        #[source]
        source: LeaseManagerError,
    },
}

/// A running election: the lease manager and the fence's watch of the Lease.
pub struct Election {
    leadership: Leadership,
    control: Option<tokio::sync::watch::Receiver<bool>>,
    manager: JoinHandle<Result<kube_lease_manager::LeaseManager, LeaseManagerError>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Election {
    /// Starts electing: creates the Lease if it does not exist, then tries to take it and keeps
    /// renewing it while held.
    /// `leader` is set to 1 while this replica leads, 0 otherwise.
    pub async fn start(
        client: Client,
        config: ElectionConfig,
        leader: prometheus_client::metrics::gauge::Gauge,
    ) -> Result<Self, ElectionError> {
        config.check()?;
        let setup = |source| ElectionError::Setup {
            namespace: config.namespace.clone(),
            name: config.lease_name.clone(),
            source,
        };
        let manager = LeaseManagerBuilder::new(client.clone(), &config.lease_name)
            .with_namespace(&config.namespace)
            .with_identity(&config.identity)
            .with_duration(config.lease_duration.as_secs())
            .with_grace(config.grace_seconds())
            .with_field_manager(format!(
                "{}-lease/{}",
                crate::identity::FIELD_MANAGER,
                config.identity
            ))
            .build()
            .await
            .map_err(setup)?;
        let (gained, _) = tokio::sync::watch::channel(0u64);
        let leadership = Leadership {
            shared: Some(Arc::new(Shared {
                identity: config.identity.clone(),
                renew_deadline: config.renew_deadline,
                inputs: Mutex::default(),
                changed: tokio::sync::Notify::new(),
                gained,
            })),
        };
        info!(lease = %format!("{}/{}", config.namespace, config.lease_name), identity = %config.identity, "leader election: standing by until this replica holds the lease");
        let (control, manager) = manager.watch().await;

        let mut holds = control.clone();
        let l = leadership.clone();
        let follow_manager = tokio::spawn(async move {
            loop {
                let now = *holds.borrow_and_update();
                l.update(|i| i.holds = now);
                if holds.changed().await.is_err() {
                    l.update(|i| i.holds = false);
                    return;
                }
            }
        });

        let api: Api<Lease> = Api::namespaced(client, &config.namespace);
        let wc = watcher::Config::default().fields(&format!("metadata.name={}", config.lease_name));
        let l = leadership.clone();
        let follow_lease = tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(api, wc).default_backoff());
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)) => {
                        let view = LeaseView::of(&lease);
                        l.update(|i| i.lease = Some(view));
                    }
                    Ok(watcher::Event::Delete(_)) => l.update(|i| i.lease = None),
                    Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
                    Err(e) => warn!(error = %e, "watching the leader Lease failed; retrying"),
                }
            }
        });

        let l = leadership.clone();
        let supervise = tokio::spawn(supervise(l, leader));
        Ok(Self {
            leadership,
            control: Some(control),
            manager,
            tasks: vec![follow_manager, follow_lease, supervise],
        })
    }

    /// The fence the controller checks.
    pub fn leadership(&self) -> Leadership {
        self.leadership.clone()
    }

    /// Stops electing without releasing the Lease: it expires as after a crash, and only then
    /// may a standby act (for a stop that had to drop work whose requests may still be on
    /// their way). The fence is lowered first.
    pub fn abandon(mut self) {
        self.leadership.update(|i| i.holds = false);
        self.manager.abort();
        for t in &self.tasks {
            t.abort();
        }
        // Never closed: its close is what makes the manager release the Lease, and the abort
        // takes effect only at the manager's next await. The process is exiting.
        std::mem::forget(self.control.take());
        warn!("leader election: the Lease is left to expire, as after a crash");
    }

    /// Stops electing and releases the Lease if this replica holds it, so a standby takes over
    /// at once instead of after the lease duration.
    pub async fn release(mut self) {
        // The lease manager releases the Lease when its control channel closes.
        self.leadership.update(|i| i.holds = false);
        drop(self.control.take());
        for t in &self.tasks {
            t.abort();
        }
        match tokio::time::timeout(Duration::from_secs(5), &mut self.manager).await {
            Ok(Ok(Ok(_))) => info!("leader election: lease released"),
            Ok(Ok(Err(e))) => warn!(error = %e, "leader election: releasing the lease failed"),
            Ok(Err(e)) => warn!(error = %e, "leader election task failed"),
            Err(_) => {
                warn!("leader election: the lease was not released within 5 s");
                self.manager.abort();
            }
        }
    }
}

/// Logs and counts transitions of the fence, also those that happen by the clock alone (a
/// renew deadline that passes): wakes at each input change and at the current deadline.
async fn supervise(leadership: Leadership, leader: prometheus_client::metrics::gauge::Gauge) {
    let Some(shared) = leadership.shared.clone() else {
        return;
    };
    let mut leading = false;
    loop {
        let now_leading = leadership.fence().is_some();
        if now_leading != leading {
            leading = now_leading;
            leader.set(i64::from(leading));
            if leading {
                info!("leader election: this replica is the leader; reconciling every set");
                shared.gained.send_modify(|n| *n += 1);
            } else {
                warn!("leader election: this replica no longer leads; standing by");
            }
        }
        let wake_at = {
            let inputs = shared.inputs.lock().expect("leadership lock");
            inputs
                .lease
                .as_ref()
                .and_then(|l| l.renewed)
                .and_then(|r| r.checked_add(shared.renew_deadline))
                .and_then(|until| until.duration_since(SystemTime::now()).ok())
        };
        let sleep = wake_at.unwrap_or(Duration::from_secs(3600)) + Duration::from_millis(1);
        tokio::select! {
            _ = shared.changed.notified() => {}
            _ = tokio::time::sleep(sleep) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(holder: Option<&str>, renewed_ago: Option<u64>, now: SystemTime) -> LeaseView {
        LeaseView {
            holder: holder.map(str::to_owned),
            renewed: renewed_ago.map(|s| now - Duration::from_secs(s)),
            acquired: None,
        }
    }

    #[test]
    fn acts_only_as_the_fresh_holder_the_manager_agrees_on() {
        let now = SystemTime::now();
        let d = Duration::from_secs(10);
        let me = "a";
        // The holder, renewed 3 s ago, manager agrees.
        assert!(may_act(
            true,
            Some(&view(Some(me), Some(3), now)),
            me,
            d,
            now
        ));
        // The manager does not (yet, or any more) report holding it.
        assert!(!may_act(
            false,
            Some(&view(Some(me), Some(3), now)),
            me,
            d,
            now
        ));
        // Someone else holds it.
        assert!(!may_act(
            true,
            Some(&view(Some("b"), Some(3), now)),
            me,
            d,
            now
        ));
        // Nobody holds it.
        assert!(!may_act(true, Some(&view(None, Some(3), now)), me, d, now));
        // Renewed exactly the deadline ago, or longer: the fence is closed.
        assert!(!may_act(
            true,
            Some(&view(Some(me), Some(10), now)),
            me,
            d,
            now
        ));
        assert!(!may_act(
            true,
            Some(&view(Some(me), Some(60), now)),
            me,
            d,
            now
        ));
        // No renew time, or no Lease seen: no.
        assert!(!may_act(true, Some(&view(Some(me), None, now)), me, d, now));
        assert!(!may_act(true, None, me, d, now));
    }

    #[test]
    fn a_paused_leader_stops_acting_before_another_may_start() {
        // Renewed at t0; another replica may take the Lease at t0 + lease_duration (its clock,
        // even if it runs up to lease_duration − renew_deadline ahead of ours).
        let cfg = config(15, 10, 2);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let lease = LeaseView {
            holder: Some("a".into()),
            renewed: Some(t0),
            acquired: Some(t0),
        };
        let skew = cfg.lease_duration - cfg.renew_deadline;
        let others_start = t0 + cfg.lease_duration - skew;
        for ms in (0..20_000).step_by(250) {
            let now = t0 + Duration::from_millis(ms);
            if now >= others_start {
                assert!(
                    !may_act(true, Some(&lease), "a", cfg.renew_deadline, now),
                    "{ms} ms"
                );
            }
        }
    }

    #[test]
    fn a_tenure_outlasts_a_fence_that_closes_and_opens_but_not_another_acquire() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let deadline = Duration::from_secs(10);
        let held = |acquired: u64, renewed: u64| LeaseView {
            holder: Some("a".into()),
            renewed: Some(t0 + Duration::from_secs(renewed)),
            acquired: Some(t0 + Duration::from_secs(acquired)),
        };
        let at = |s: u64| t0 + Duration::from_secs(s);
        let first = tenure(true, Some(&held(0, 0)), "a", deadline, at(1)).expect("leads");
        // The renew seen late: the fence closes, then opens with the next renew, same tenure.
        assert_eq!(tenure(true, Some(&held(0, 0)), "a", deadline, at(11)), None);
        assert_eq!(
            tenure(true, Some(&held(0, 12)), "a", deadline, at(13)),
            Some(first)
        );
        // Taken again (after another replica held it, or after it expired): a new tenure.
        let again = tenure(true, Some(&held(40, 40)), "a", deadline, at(41)).expect("leads");
        assert_ne!(again, first);
        // Another holder: none.
        let theirs = LeaseView {
            holder: Some("b".into()),
            ..held(40, 40)
        };
        assert_eq!(tenure(true, Some(&theirs), "a", deadline, at(41)), None);
        // Without election, one tenure for ever.
        assert_eq!(Leadership::always().fence(), Some(Tenure::default()));
    }

    fn config(lease: u64, renew: u64, retry: u64) -> ElectionConfig {
        ElectionConfig {
            namespace: "ns".into(),
            lease_name: "l".into(),
            identity: "a".into(),
            lease_duration: Duration::from_secs(lease),
            renew_deadline: Duration::from_secs(renew),
            retry_period: Duration::from_secs(retry),
        }
    }

    #[test]
    fn durations_must_be_ordered_and_whole() {
        assert_eq!(config(15, 10, 2).check(), Ok(()));
        assert_eq!(config(15, 10, 2).grace_seconds(), 13);
        assert!(matches!(
            config(15, 15, 2).check(),
            Err(ConfigError::Durations { .. })
        ));
        assert!(matches!(
            config(15, 10, 10).check(),
            Err(ConfigError::Durations { .. })
        ));
        assert!(matches!(
            config(10, 15, 2).check(),
            Err(ConfigError::Durations { .. })
        ));
        let mut c = config(15, 10, 2);
        c.lease_duration = Duration::from_millis(15_500);
        assert!(matches!(c.check(), Err(ConfigError::NotWholeSeconds(_))));
        let mut c = config(15, 10, 2);
        c.identity.clear();
        assert_eq!(c.check(), Err(ConfigError::NoIdentity));
    }

    #[tokio::test]
    async fn without_election_a_replica_always_acts_and_never_gains() {
        let l = Leadership::always();
        assert!(l.fence().is_some());
        assert!(!l.elected());
        assert!(std::pin::pin!(l.gained()).next().await.is_none());
    }
}
