//! What `kubectl drain-status --volumes` shows: the PersistentVolumes the controller retains
//! after their drained claims were deleted (`drain-retain-volume-for`), and how to restore one.
//! Pure: no client, no clock.

use std::collections::BTreeMap;

use drain_api::retained;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::PersistentVolume;

use crate::view::{format_age, render_columns};

/// One retained volume, as shown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetainedVolume {
    /// The volume.
    pub name: String,
    /// The drained claim's namespace.
    pub namespace: String,
    /// The drained claim.
    pub claim: String,
    /// The StatefulSet.
    pub set: String,
    /// The drain pod.
    pub pod: String,
    /// `Released` (its claim is gone), `Available`, `Bound` (restored), as the volume says.
    pub phase: String,
    /// When the retention ends, if readable.
    pub until: Option<Timestamp>,
    /// What a claim that restores it asks for.
    pub storage_class: Option<String>,
    /// Its capacity (`1Gi`).
    pub capacity: Option<String>,
    /// Its access modes.
    pub access_modes: Vec<String>,
}

impl RetainedVolume {
    /// Reads the marks of `pv`; `None` for a volume that carries none.
    pub fn of(pv: &PersistentVolume) -> Option<Self> {
        let annotations = pv.metadata.annotations.as_ref()?;
        let get = |key: &str| annotations.get(key).cloned().unwrap_or_default();
        let (namespace, claim) = get(retained::CLAIM)
            .split_once('/')
            .map(|(n, c)| (n.to_owned(), c.to_owned()))?;
        let set = get(retained::SET);
        let set = set
            .split_once('/')
            .map_or(set.clone(), |(_, s)| s.to_owned());
        let spec = pv.spec.clone().unwrap_or_default();
        Some(Self {
            name: pv.metadata.name.clone().unwrap_or_default(),
            namespace,
            claim,
            set,
            pod: get(retained::POD),
            phase: pv
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default(),
            until: get(retained::UNTIL).parse().ok(),
            storage_class: spec.storage_class_name,
            capacity: spec
                .capacity
                .and_then(|c| c.get("storage").map(|q| q.0.clone())),
            access_modes: spec.access_modes.unwrap_or_default(),
        })
    }
}

/// The table of retained volumes, then for each how to restore it.
pub fn render(volumes: &[RetainedVolume], now: Timestamp) -> String {
    let mut rows = vec![
        [
            "VOLUME",
            "NAMESPACE",
            "CLAIM",
            "SET",
            "DRAIN POD",
            "PHASE",
            "RELEASED IN",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    for v in volumes {
        let left = match v.until {
            Some(until) if until > now => format_age(until, now),
            Some(_) => "due".to_owned(),
            None => "never (unreadable)".to_owned(),
        };
        rows.push(vec![
            v.name.clone(),
            v.namespace.clone(),
            v.claim.clone(),
            v.set.clone(),
            v.pod.clone(),
            v.phase.clone(),
            left,
        ]);
    }
    let mut out = render_columns(&rows);
    for v in volumes {
        out.push('\n');
        out.push_str(&restore_steps(v));
    }
    out
}

/// How to bring `v` back as its claim, with kubectl, step by step.
pub fn restore_steps(v: &RetainedVolume) -> String {
    let RetainedVolume {
        name,
        namespace,
        claim,
        set,
        pod,
        ..
    } = v;
    let replicas = drain_api::names::parse_pod_name(pod, set)
        .map_or_else(|| "<N>".to_owned(), |o| (o + 1).to_string());
    let mut spec = BTreeMap::new();
    spec.insert("volumeName", format!("\"{name}\""));
    if let Some(class) = &v.storage_class {
        spec.insert("storageClassName", format!("\"{class}\""));
    }
    let modes = if v.access_modes.is_empty() {
        vec!["ReadWriteOnce".to_owned()]
    } else {
        v.access_modes.clone()
    };
    let modes = modes
        .iter()
        .map(|m| format!("\"{m}\""))
        .collect::<Vec<_>>()
        .join(", ");
    spec.insert("accessModes", format!("[{modes}]"));
    let capacity = v.capacity.clone().unwrap_or_else(|| "1Gi".to_owned());
    spec.insert(
        "resources",
        format!("{{\"requests\": {{\"storage\": \"{capacity}\"}}}}"),
    );
    let spec = spec
        .iter()
        .map(|(k, v)| format!("\"{k}\": {v}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "To restore volume {name} as claim {claim} in namespace {namespace}:\n\
         \x20 # 1. Bind the volume to that claim name only (nothing else can take it):\n\
         \x20 kubectl patch pv {name} --type merge -p '{{\"spec\": {{\"claimRef\": {{\"namespace\": \"{namespace}\", \"name\": \"{claim}\", \"uid\": null, \"resourceVersion\": null}}}}}}'\n\
         \x20 # 2. Create the claim on it and scale statefulset {set} up to bring its pod back onto\n\
         \x20 #    it. The claim is marked held ({hold}): it is not drained while its\n\
         \x20 #    pod is away; the scale-up clears the mark (remove it to drain the claim instead).\n\
         \x20 #    With spec.ordinals.start S, use S fewer replicas. First delete a claim {claim}\n\
         \x20 #    made since, if it holds nothing you need.\n\
         \x20 kubectl create -n {namespace} -f - <<< '{{\"apiVersion\": \"v1\", \"kind\": \"PersistentVolumeClaim\", \"metadata\": {{\"name\": \"{claim}\", \"annotations\": {{\"{hold}\": \"restored\"}}}}, \"spec\": {{{spec}}}}}' && kubectl scale -n {namespace} statefulset {set} --replicas={replicas}\n\
         \x20 # Once the claim is bound, the controller puts the volume's original reclaim policy\n\
         \x20 # back: an ordinary claim again. To only read the data, bind it under another claim\n\
         \x20 # name instead (one the set does not use) and mount it in a pod of your own.\n",
        hold = drain_api::claim_annotations::HOLD,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PersistentVolumeSpec, PersistentVolumeStatus};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pv() -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some("pvc-1234".into()),
                annotations: Some(BTreeMap::from([
                    (retained::CLAIM.into(), "demo/data-web-2".into()),
                    (retained::SET.into(), "demo/web".into()),
                    (retained::POD.into(), "web-2".into()),
                    (retained::UNTIL.into(), "2026-11-27T12:00:00Z".into()),
                ])),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeSpec {
                storage_class_name: Some("standard".into()),
                capacity: Some(BTreeMap::from([(
                    "storage".into(),
                    Quantity("64Mi".into()),
                )])),
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                ..PersistentVolumeSpec::default()
            }),
            status: Some(PersistentVolumeStatus {
                phase: Some("Released".into()),
                ..PersistentVolumeStatus::default()
            }),
        }
    }

    #[test]
    fn a_retained_volume_is_listed_with_when_it_is_released_and_how_to_restore_it() {
        let v = RetainedVolume::of(&pv()).unwrap();
        assert_eq!(
            (v.namespace.as_str(), v.claim.as_str(), v.set.as_str()),
            ("demo", "data-web-2", "web")
        );
        let now: Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
        let out = render(&[v], now);
        let mut lines = out.lines();
        let header = lines.next().unwrap();
        assert!(header.starts_with("VOLUME"), "{out}");
        let row = lines.next().unwrap();
        for cell in [
            "pvc-1234",
            "demo",
            "data-web-2",
            "web",
            "web-2",
            "Released",
            "120m",
        ] {
            assert!(row.contains(cell), "{cell} in {row}");
        }
        assert!(out.contains(r#"kubectl patch pv pvc-1234 --type merge -p '{"spec": {"claimRef": {"namespace": "demo", "name": "data-web-2", "uid": null, "resourceVersion": null}}}'"#), "{out}");
        // The claim's JSON parses, and asks for exactly this volume.
        let json = out
            .lines()
            .find_map(|l| l.split("<<< '").nth(1))
            .and_then(|l| l.split_once("' && ").map(|(json, _)| json))
            .unwrap();
        assert!(
            out.contains("kubectl scale -n demo statefulset web --replicas=3"),
            "{out}"
        );
        let claim: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(claim["metadata"]["name"], "data-web-2");
        // Held: not drained again while its pod is away.
        assert_eq!(
            claim["metadata"]["annotations"][drain_api::claim_annotations::HOLD],
            "restored"
        );
        assert_eq!(claim["spec"]["volumeName"], "pvc-1234");
        assert_eq!(claim["spec"]["storageClassName"], "standard");
        assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "64Mi");
        assert_eq!(claim["spec"]["accessModes"][0], "ReadWriteOnce");
    }

    #[test]
    fn a_volume_without_marks_is_not_listed() {
        let mut unmarked = pv();
        unmarked.metadata.annotations = None;
        assert_eq!(RetainedVolume::of(&unmarked), None);
    }

    #[test]
    fn an_overdue_retention_shows_due() {
        let v = RetainedVolume::of(&pv()).unwrap();
        let later: Timestamp = "2026-11-28T00:00:00Z".parse().unwrap();
        assert!(render(&[v], later).lines().nth(1).unwrap().contains("due"));
    }
}
