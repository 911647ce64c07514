//! Is the data directory the drained claim, as the StatefulSet's own pods see it?
//!
//! A mount point is not enough: with a `subPath` the kubelet creates the directory empty when
//! it is missing, so a drain template that mounts `data` with `subPath: x` while the app mounts
//! the whole claim finds an empty directory and would "drain" nothing, and the claim would be
//! deleted. So in a drain pod the drainer reads its own pod and its StatefulSet and checks
//! ([`check`], pure) that:
//! - a container of the drain pod mounts a volume at the data directory,
//! - that volume is a PersistentVolumeClaim (the drained claim the controller bound),
//! - and it is mounted with the same `subPath` as the set's pod template mounts that claim
//!   template (when the template mounts it at all).

use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, VolumeMount};

/// How the data directory was found to be the claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimMount {
    /// The claim template's name (the drain pod's volume name).
    pub volume: String,
    /// The claim bound to it.
    pub claim: String,
    /// The `subPath`, if any.
    pub sub_path: Option<String>,
}

/// Why the data directory is not the claim as the set's pods see it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MountError {
    /// No container of the drain pod mounts anything at the data directory.
    #[error(
        "no container of drain pod {pod} mounts a volume at the data directory {}: mount the \
         claim there or set --data-dir to its mountPath (claims are mounted at: {mounted})",
        dir.display()
    )]
    NoMount {
        /// The drain pod.
        pod: String,
        /// The data directory.
        dir: PathBuf,
        /// Where claim volumes are mounted instead.
        mounted: String,
    },
    /// The volume at the data directory is not a claim.
    #[error(
        "the volume {volume:?} mounted at the data directory {} is not a PersistentVolumeClaim, \
         so it is not the drained claim", dir.display()
    )]
    NotAClaim {
        /// The volume.
        volume: String,
        /// The data directory.
        dir: PathBuf,
    },
    /// The drain pod mounts another part of the claim than the set's pods do.
    #[error(
        "the drain pod mounts claim {claim} with subPath {drain:?}, but the statefulset's pods \
         mount it with subPath {app}: the data directory is not where the data is (fix the \
         volumeMount's subPath in the drain template)"
    )]
    SubPathMismatch {
        /// The claim.
        claim: String,
        /// The drain pod's subPath (empty: the whole claim).
        drain: String,
        /// The set's subPaths.
        app: String,
    },
}

/// Checks that `dir` is, in drain pod `pod`, a claim mounted like the set's pods mount it.
pub fn check(pod: &Pod, set: &StatefulSet, dir: &Path) -> Result<ClaimMount, MountError> {
    let dir = normalize(dir);
    let spec = pod.spec.as_ref();
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let mounts = || {
        spec.into_iter()
            .flat_map(|s| &s.containers)
            .flat_map(|c| c.volume_mounts.iter().flatten())
    };
    let claim_of = |volume: &str| {
        spec.into_iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .find(|v| v.name == volume)
            .and_then(|v| v.persistent_volume_claim.as_ref())
            .map(|c| c.claim_name.clone())
    };
    let Some(mount) = mounts().find(|m| normalize(Path::new(&m.mount_path)) == dir) else {
        let mut mounted: Vec<String> = mounts()
            .filter(|m| claim_of(&m.name).is_some())
            .map(|m| m.mount_path.clone())
            .collect();
        mounted.dedup();
        return Err(MountError::NoMount {
            pod: pod_name,
            dir,
            mounted: if mounted.is_empty() {
                "nowhere".to_owned()
            } else {
                mounted.join(", ")
            },
        });
    };
    let Some(claim) = claim_of(&mount.name) else {
        return Err(MountError::NotAClaim {
            volume: mount.name.clone(),
            dir,
        });
    };
    let drain_sub_path = sub_path(mount);
    let app: Vec<Option<String>> = set
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .into_iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .flat_map(|c| c.volume_mounts.iter().flatten())
        .filter(|m| m.name == mount.name && m.sub_path_expr.is_none())
        .map(sub_path)
        .collect();
    // A subPathExpr depends on the pod's own fields: not comparable, so not checked.
    if mount.sub_path_expr.is_none() && !app.is_empty() && !app.contains(&drain_sub_path) {
        let show = |p: &Option<String>| format!("{:?}", p.as_deref().unwrap_or(""));
        let mut app: Vec<String> = app.iter().map(show).collect();
        app.dedup();
        return Err(MountError::SubPathMismatch {
            claim,
            drain: drain_sub_path.unwrap_or_default(),
            app: app.join(" or "),
        });
    }
    Ok(ClaimMount {
        volume: mount.name.clone(),
        claim,
        sub_path: drain_sub_path,
    })
}

/// The subPath, `None` for the whole volume.
fn sub_path(m: &VolumeMount) -> Option<String> {
    m.sub_path
        .as_deref()
        .map(|p| p.trim_matches('/'))
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
}

/// `path` without `.` parts or trailing slashes (mount paths are absolute; `..` is kept).
fn normalize(path: &Path) -> PathBuf {
    path.components()
        .filter(|c| !matches!(c, Component::CurDir))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(mounts: serde_json::Value, volumes: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "ds-2"},
            "spec": {
                "containers": [{"name": "drainer", "volumeMounts": mounts}],
                "volumes": volumes,
            }
        }))
        .unwrap()
    }

    fn claim_volume() -> serde_json::Value {
        json!([{"name": "data", "persistentVolumeClaim": {"claimName": "data-ds-2"}}])
    }

    fn set(mounts: serde_json::Value) -> StatefulSet {
        serde_json::from_value(json!({
            "metadata": {"name": "ds"},
            "spec": {
                "selector": {},
                "serviceName": "ds",
                "template": {"spec": {"containers": [{"name": "app", "volumeMounts": mounts}]}}
            }
        }))
        .unwrap()
    }

    #[test]
    fn the_claim_mounted_like_the_app_mounts_it_passes() {
        let p = pod(
            json!([{"name": "data", "mountPath": "/data/"}]),
            claim_volume(),
        );
        let s = set(json!([{"name": "data", "mountPath": "/var/lib/app"}]));
        assert_eq!(
            check(&p, &s, Path::new("/data")),
            Ok(ClaimMount {
                volume: "data".into(),
                claim: "data-ds-2".into(),
                sub_path: None
            })
        );
        let p = pod(
            json!([{"name": "data", "mountPath": "/data", "subPath": "db/"}]),
            claim_volume(),
        );
        let s = set(json!([{"name": "data", "mountPath": "/x", "subPath": "db"}]));
        assert!(check(&p, &s, Path::new("/data/.")).is_ok());
    }

    #[test]
    fn a_sub_path_the_app_does_not_use_is_refused() {
        let p = pod(
            json!([{"name": "data", "mountPath": "/data", "subPath": "x"}]),
            claim_volume(),
        );
        let s = set(json!([{"name": "data", "mountPath": "/data"}]));
        let err = check(&p, &s, Path::new("/data")).unwrap_err();
        assert!(matches!(err, MountError::SubPathMismatch { .. }), "{err}");
        assert!(err.to_string().contains(r#"subPath "x""#), "{err}");

        // The other way round: the app uses a subPath, the drain pod mounts the whole claim.
        let p = pod(
            json!([{"name": "data", "mountPath": "/data"}]),
            claim_volume(),
        );
        let s = set(json!([{"name": "data", "mountPath": "/data", "subPath": "db"}]));
        assert!(matches!(
            check(&p, &s, Path::new("/data")),
            Err(MountError::SubPathMismatch { .. })
        ));
    }

    #[test]
    fn nothing_or_something_else_at_the_data_directory_is_refused() {
        let p = pod(
            json!([{"name": "data", "mountPath": "/var/data"}]),
            claim_volume(),
        );
        let s = set(json!([]));
        let err = check(&p, &s, Path::new("/data")).unwrap_err();
        assert!(
            err.to_string().contains("claims are mounted at: /var/data"),
            "{err}"
        );

        let p = pod(
            json!([{"name": "scratch", "mountPath": "/data"}]),
            json!([{"name": "scratch", "emptyDir": {}}]),
        );
        assert!(matches!(
            check(&p, &s, Path::new("/data")),
            Err(MountError::NotAClaim { .. })
        ));
    }

    #[test]
    fn a_sub_path_expr_is_not_compared() {
        let p = pod(
            json!([{"name": "data", "mountPath": "/data", "subPathExpr": "$(POD)"}]),
            claim_volume(),
        );
        let s = set(json!([{"name": "data", "mountPath": "/data"}]));
        assert!(check(&p, &s, Path::new("/data")).is_ok());
    }
}
