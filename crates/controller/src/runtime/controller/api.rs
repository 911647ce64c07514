//! Calls to the API server shared by the act seam and the OpenKruise hand-off: API handles,
//! preconditioned deletes, and what an error says about the object (gone, replaced).

use kube::api::{DeleteParams, Preconditions};
use kube::{Api, Client, Resource};

pub(super) fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

pub(super) fn ok_if_gone(r: Result<(), kube::Error>) -> Result<(), kube::Error> {
    match r {
        // 404: gone already; 409: the UID precondition failed, so the object we meant is gone.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        other => other,
    }
}

/// Whether a failed write means the object we meant is gone or replaced: 404, 409 (UID
/// precondition), or 422 rejecting the `metadata.uid` sent in a patch (immutable field: the
/// object under that name has another UID). Any other 422 stays an error.
pub(super) fn gone_or_replaced(e: &kube::Error) -> bool {
    let kube::Error::Api(s) = e else {
        return false;
    };
    match s.code {
        404 | 409 => true,
        422 => uid_rejected(s),
        _ => false,
    }
}

/// Whether an Invalid (422) status is about `metadata.uid`: by its causes, or by its message
/// when it has none ("... is invalid: metadata.uid: Invalid value: ...: field is immutable").
pub(super) fn uid_rejected(s: &kube::core::Status) -> bool {
    s.details
        .iter()
        .flat_map(|d| &d.causes)
        .any(|c| c.field == "metadata.uid")
        || s.message.contains("metadata.uid")
}

pub(super) fn preconditioned(uid: &str, resource_version: Option<&str>) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: resource_version.map(str::to_owned),
        }),
        ..DeleteParams::background()
    }
}
