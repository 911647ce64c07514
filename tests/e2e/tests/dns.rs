//! Cluster DNS on the real cluster (`tests/cluster/lib/dns`: CoreDNS behind the `kube-dns`
//! Service, kube-proxy, the kubelet's `clusterDNS`): a StatefulSet pod's stable name under its
//! headless Service resolves to the pod and follows it when it is recreated; a pod is given the
//! `kube-dns` Service and its namespace's search path, the `kubernetes` Service's name resolves
//! (also as `kubernetes.default`, through the search path), and a name outside the cluster is
//! answered NXDOMAIN at once rather than timing out.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use e2e::faults::exec;
use e2e::objects::SetBuilder;
use e2e::ops::{T, pod_names, running_ready, start_set, wait_running};
use e2e::{TestNamespace, client, wait_for};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::DeleteParams;

/// The container of [`SetBuilder`]'s pods.
const APP: &str = "app";

/// What the busybox `nslookup` in `pod` says about `name`: its output (for messages) and the
/// IPv4 addresses it answered (none when the name does not resolve).
async fn lookup(ns: &TestNamespace, pod: &str, name: &str) -> Result<(String, BTreeSet<String>)> {
    let out = exec(ns, pod, APP, &format!("nslookup -type=a {name} 2>&1; true")).await?;
    // The server's own address comes first, as `Address:\t<ip>:53`; the answers follow `Name:`.
    let addresses = out
        .lines()
        .skip_while(|l| !l.starts_with("Name:"))
        .filter_map(|l| l.strip_prefix("Address:"))
        .map(|a| a.trim().to_owned())
        .collect();
    Ok((out, addresses))
}

/// Waits until `name`, looked up from `pod`, resolves to `ip` and nothing else (answers carry
/// the kubernetes plugin's TTL of 5 s, so a changed name takes up to that long to show, after
/// its EndpointSlice changed); returns how long it took.
async fn wait_resolves_to(ns: &TestNamespace, pod: &str, name: &str, ip: &str) -> Result<Duration> {
    let start = Instant::now();
    let want = BTreeSet::from([ip.to_owned()]);
    loop {
        let (out, addresses) = lookup(ns, pod, name).await?;
        if addresses == want {
            return Ok(start.elapsed());
        }
        ensure!(
            start.elapsed() < T,
            "{name} did not resolve to {ip} alone from {pod} within {T:?}; the last nslookup:\n{out}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The pod's IP and UID, once it is Running and Ready.
async fn ip_and_uid(ns: &TestNamespace, pod: &str) -> Result<(String, String)> {
    let p = ns.api::<Pod>().get(pod).await?;
    ensure!(running_ready(&p), "{pod} is not Running and Ready");
    let ip = p.status.and_then(|s| s.pod_ip).context("no pod IP")?;
    Ok((ip, p.metadata.uid.unwrap_or_default()))
}

#[tokio::test]
async fn a_stateful_pods_name_resolves_to_it_and_follows_it_when_recreated() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "dns-set").await?;
    let set = SetBuilder::new("web")
        .replicas(2)
        .claims(&[])
        .script("true");
    start_set(&ns, &set).await?;
    wait_running(&ns, &pod_names("web", 0..2)).await?;

    let name = format!("web-1.web.{}.svc.cluster.local.", ns.name);
    let (old_ip, old_uid) = ip_and_uid(&ns, "web-1").await?;
    let took = wait_resolves_to(&ns, "web-0", &name, &old_ip).await?;
    println!("{name} resolved to web-1's IP {old_ip} from web-0 after {took:?}");

    ns.api::<Pod>()
        .delete("web-1", &DeleteParams::default())
        .await?;
    let pods = ns.api::<Pod>();
    wait_for(T, "web-1 recreated, Running and Ready", || async {
        Ok(pods.get_opt("web-1").await?.is_some_and(|p| {
            p.metadata.uid.as_deref() != Some(old_uid.as_str()) && running_ready(&p)
        }))
    })
    .await?;
    let (new_ip, _) = ip_and_uid(&ns, "web-1").await?;
    // host-local IPAM hands out addresses round-robin, so the new pod normally gets a new one.
    let reused = if new_ip == old_ip {
        " (the IPAM gave web-1 its old IP back: this run shows the recreated pod resolves, not that the name moved)"
    } else {
        ""
    };
    let took = wait_resolves_to(&ns, "web-0", &name, &new_ip)
        .await
        .with_context(|| format!("after web-1 was recreated, {old_ip} → {new_ip}{reused}"))?;
    println!(
        "after web-1 was recreated ({old_ip} → {new_ip}{reused}), {name} resolved to {new_ip} after {took:?}"
    );
    Ok(())
}

#[tokio::test]
async fn pods_resolve_through_the_cluster_dns_and_outside_names_fail_at_once() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "dns-names").await?;
    let set = SetBuilder::new("probe")
        .replicas(1)
        .claims(&[])
        .script("true");
    start_set(&ns, &set).await?;
    wait_running(&ns, &pod_names("probe", 0..1)).await?;
    let cluster_ip = |namespace: &str, name: &str| {
        let services = kube::Api::<Service>::namespaced(client.clone(), namespace);
        let name = name.to_owned();
        async move {
            services
                .get(&name)
                .await?
                .spec
                .and_then(|s| s.cluster_ip)
                .with_context(|| format!("the {name} Service has no cluster IP"))
        }
    };
    let dns_ip = cluster_ip("kube-system", "kube-dns").await?;
    let api_ip = cluster_ip("default", "kubernetes").await?;

    // What the kubelet gives the pod: the kube-dns Service, and the search path of its namespace.
    let conf = exec(&ns, "probe-0", APP, "cat /etc/resolv.conf").await?;
    let search = format!(
        "search {}.svc.cluster.local svc.cluster.local cluster.local",
        ns.name
    );
    ensure!(
        conf.lines().any(|l| l == format!("nameserver {dns_ip}"))
            && conf.lines().any(|l| l.starts_with(&search)),
        "the pod's resolv.conf does not name kube-dns ({dns_ip}) and its namespace's search path:\n{conf}"
    );

    let name = "kubernetes.default.svc.cluster.local.";
    let took = wait_resolves_to(&ns, "probe-0", name, &api_ip).await?;
    println!("{name} resolved to {api_ip} after {took:?}");
    // The libc resolver (busybox's ping) expands a short name through the search path.
    let out = exec(
        &ns,
        "probe-0",
        APP,
        "ping -c1 -W1 kubernetes.default 2>&1; true",
    )
    .await?;
    ensure!(
        out.starts_with(&format!("PING kubernetes.default ({api_ip})")),
        "kubernetes.default did not resolve to {api_ip} through the search path:\n{out}"
    );
    println!("kubernetes.default resolved to {api_ip} through the search path");

    // No upstream: the cluster's DNS answers NXDOMAIN for every other name, at once (a resolver
    // timeout is 5 s or more): asked directly, and through the libc resolver and its search path.
    let start = Instant::now();
    let (out, addresses) = lookup(&ns, "probe-0", "example.com.").await?;
    let took = start.elapsed();
    ensure!(
        addresses.is_empty() && out.contains("NXDOMAIN"),
        "example.com. did not get NXDOMAIN:\n{out}"
    );
    ensure!(
        took < Duration::from_secs(4),
        "example.com. took {took:?} to fail:\n{out}"
    );
    println!("example.com.: NXDOMAIN in {took:?} (kubectl exec included)");
    let start = Instant::now();
    let out = exec(&ns, "probe-0", APP, "ping -c1 -W1 example.com 2>&1; true").await?;
    let took = start.elapsed();
    ensure!(
        out.contains("bad address 'example.com'"),
        "example.com resolved through the search path:\n{out}"
    );
    ensure!(
        took < Duration::from_secs(4),
        "example.com took {took:?} to fail through the search path:\n{out}"
    );
    println!(
        "example.com through the search path: no such host in {took:?} (kubectl exec included)"
    );
    Ok(())
}
