//! The Events reference (docs/operations.md) and the code name the same reasons. Every reason
//! the reference documents is a string in the controller's source; every CamelCase string in
//! the source is documented there, or is one of the Kubernetes words the controller reads (and
//! never publishes), listed below. A reason added, renamed or removed fails here until the
//! reference says so.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// CamelCase strings in the source that are not reasons the controller publishes: Kubernetes'
/// own words it reads or writes in objects, and reasons of its own it never publishes.
const NOT_PUBLISHED: &[&str] = &[
    // Container waiting and termination reasons, pod conditions, eviction causes.
    "ContainerCannotRun",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "DisruptionTarget",
    "ErrImageNeverPull",
    "ErrImagePull",
    "EvictionByEvictionAPI",
    "ImagePullBackOff",
    "InvalidImageName",
    "PodScheduled",
    "PreCreateHookError",
    "RunContainerError",
    // Node conditions, reasons and taint effects (a lost node is read from them).
    "MemoryPressure",
    "NodeStatusUnknown",
    "NoExecute",
    // API status reasons and causes, selector operators, spec values and kinds.
    "DoesNotExist",
    "FieldValueInvalid",
    "InternalError",
    "NamespaceTerminating",
    "NotIn",
    "InPlaceIfPossible",
    "OnFailure",
    "OrderedReady",
    "ReadWriteOnce",
    "ResourceVersion",
    "RollingUpdate",
    "PodTemplate",
    "StatefulSet",
    "ControllerRevision",
    "NaN",
    // Only without the template annotation, when a set is not validated at all.
    "MissingDrainTemplate",
    // A replica that lost the lead stops acting; nothing is published for it.
    "NotLeader",
];

fn source_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            source_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Strings of two or more humps: `"DrainFailed"`, not `"Retain"`, `"FALSE"` or `"v1"`.
fn camel_strings(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for piece in text.split('"').skip(1).step_by(2) {
        let humps = piece.chars().filter(char::is_ascii_uppercase).count();
        if humps >= 2
            && piece.starts_with(|c: char| c.is_ascii_uppercase())
            && piece.chars().any(|c| c.is_ascii_lowercase())
            && piece.chars().all(|c| c.is_ascii_alphanumeric())
        {
            out.insert(piece.to_owned());
        }
    }
    out
}

#[test]
fn the_events_reference_and_the_code_name_the_same_reasons() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    source_files(&root.join("src"), &mut files);
    let mut in_code = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("source");
        in_code.extend(camel_strings(&text));
    }
    let docs = std::fs::read_to_string(root.join("../../docs/operations.md")).expect("docs");
    let documented: BTreeSet<String> = docs
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_alphanumeric()))
        .filter(|w| w.starts_with(|c: char| c.is_ascii_uppercase()))
        .map(str::to_owned)
        .collect();
    let table: BTreeSet<String> = docs
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|w| w.starts_with(|c: char| c.is_ascii_uppercase()))
        .map(str::to_owned)
        .collect();
    let missing: Vec<&String> = in_code
        .iter()
        .filter(|r| !documented.contains(*r) && !NOT_PUBLISHED.contains(&r.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "reasons in the code that docs/operations.md does not document: {missing:?}"
    );
    let stale: Vec<&String> = table.iter().filter(|r| !in_code.contains(*r)).collect();
    assert!(
        stale.is_empty(),
        "reasons docs/operations.md documents that the code no longer has: {stale:?}"
    );
    assert!(table.len() > 30, "the reference's tables were not found");
}
