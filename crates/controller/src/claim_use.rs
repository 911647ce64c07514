//! Which of a drain pod's claims each container uses (mounts, or attaches as a block device):
//! the claims its completion record names, and the claims only its record can prove.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec};

/// The claims of `claims` (`{name: UID}`, the drain pod's) that `container` uses through a
/// volume of `spec` bound to the claim.
pub fn claims_used(
    spec: &PodSpec,
    container: &Container,
    claims: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let volumes = container
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.name.as_str())
        .chain(
            container
                .volume_devices
                .iter()
                .flatten()
                .map(|d| d.name.as_str()),
        );
    volumes
        .filter_map(|volume| {
            let claim = spec
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == volume)?
                .persistent_volume_claim
                .as_ref()?;
            let uid = claims.get(&claim.claim_name)?;
            Some((claim.claim_name.clone(), uid.clone()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_container_uses_the_claims_it_mounts_or_attaches_and_no_other() {
        let spec: PodSpec = serde_json::from_value(json!({
            "containers": [
                {"name": "data", "volumeMounts": [{"name": "data", "mountPath": "/d"},
                                                  {"name": "tmp", "mountPath": "/tmp"}]},
                {"name": "index", "volumeDevices": [{"name": "index", "devicePath": "/dev/i"}]},
                {"name": "proxy"},
            ],
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-2"}},
                {"name": "index", "persistentVolumeClaim": {"claimName": "index-web-2"}},
                {"name": "tmp", "emptyDir": {}},
            ]
        }))
        .unwrap();
        let claims = BTreeMap::from([
            ("data-web-2".to_owned(), "u1".to_owned()),
            ("index-web-2".to_owned(), "u2".to_owned()),
        ]);
        let used = |i: usize| claims_used(&spec, &spec.containers[i], &claims);
        assert_eq!(
            used(0),
            BTreeMap::from([("data-web-2".into(), "u1".into())])
        );
        assert_eq!(
            used(1),
            BTreeMap::from([("index-web-2".into(), "u2".into())])
        );
        assert!(used(2).is_empty());
        // A claim the pod does not drain is no claim of its record.
        let only_data = BTreeMap::from([("data-web-2".to_owned(), "u1".to_owned())]);
        assert!(claims_used(&spec, &spec.containers[1], &only_data).is_empty());
    }
}
