//! The Redis Cluster example (`example/redis-cluster`) as the tests and benchmarks deploy it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::LogParams;

use crate::faults::kubectl_apply_in;
use crate::ops::{is_drain_pod, pod_names, serving};
use crate::{TestNamespace, kubectl, repo_root, wait_for};

/// The example's StatefulSet (and headless Service).
pub const SET: &str = "redis";
/// Joining members one at a time, or draining one, takes seconds to tens of seconds each.
const T: Duration = Duration::from_secs(300);

/// Applies the example as `kubectl apply -k example/redis-cluster` does, with `replicas`.
pub fn apply_example(ns: &TestNamespace, replicas: i32) -> Result<()> {
    let out = kubectl()
        .arg("kustomize")
        .arg(repo_root().join("example/redis-cluster"))
        .output()
        .context("kubectl kustomize")?;
    ensure!(
        out.status.success(),
        "kubectl kustomize example/redis-cluster: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    ensure!(
        text.contains("replicas: 6"),
        "the example sets no replicas: 6"
    );
    let text = text.replace("replicas: 6", &format!("replicas: {replicas}"));
    kubectl_apply_in(Some(&ns.name), &text, "the Redis Cluster example")
}

/// Waits until members `0..n` are Running and Ready (each is Ready once it serves its share).
pub async fn wait_members(ns: &TestNamespace, n: i32) -> Result<()> {
    let pods = ns.api::<Pod>();
    for name in pod_names(SET, 0..n) {
        wait_for(T, &format!("member {name} Ready"), || async {
            Ok(pods.get_opt(&name).await?.is_some_and(|p| serving(&p)))
        })
        .await?;
    }
    Ok(())
}

/// The address of a member's (or drain pod's) Redis: its pod IP and the Redis port.
pub async fn member_addr(ns: &TestNamespace, pod: &str) -> Result<std::net::SocketAddr> {
    let p = ns.api::<Pod>().get(pod).await?;
    let ip: std::net::IpAddr = p
        .status
        .and_then(|s| s.pod_ip)
        .with_context(|| format!("{pod} has no IP"))?
        .parse()?;
    Ok(std::net::SocketAddr::new(ip, 6379))
}

/// A reply of the Redis protocol (RESP2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`
    Simple(String),
    /// `-MOVED 3999 10.244.0.7:6379`
    Error(String),
    /// `:42`
    Int(i64),
    /// `$5 hello`, or `$-1` (none)
    Bulk(Option<Vec<u8>>),
    /// `*2 ...`
    Array(Vec<Reply>),
}

/// Sends one command to the Redis node at `addr` on a new connection (after `ASKING` when
/// `asking`) and reads its reply; the whole within `timeout`. A [`pipeline`] of one or two.
pub async fn command(
    addr: std::net::SocketAddr,
    args: &[&[u8]],
    asking: bool,
    timeout: Duration,
) -> Result<Reply> {
    let mut commands = Vec::with_capacity(2);
    if asking {
        commands.push(vec![&b"ASKING"[..]]);
    }
    commands.push(args.to_vec());
    let mut replies = pipeline(addr, &commands, timeout).await?;
    replies.pop().context("no reply")
}

/// Sends `commands` to the Redis node at `addr` on one new connection, all at once (a
/// pipeline), and reads their replies, in order, one per command; the whole within `timeout`.
pub async fn pipeline(
    addr: std::net::SocketAddr,
    commands: &[Vec<&[u8]>],
    timeout: Duration,
) -> Result<Vec<Reply>> {
    use tokio::io::{AsyncWriteExt, BufReader};
    let run = async {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (read, mut write) = stream.into_split();
        let mut out = Vec::new();
        for c in commands {
            encode(&mut out, c);
        }
        // Written while the replies are read: neither side's buffers fill up and stall.
        let send = async move {
            write.write_all(&out).await?;
            anyhow::Ok(write)
        };
        let receive = async {
            let mut reader = BufReader::new(read);
            let mut replies = Vec::with_capacity(commands.len());
            for _ in commands {
                replies.push(read_reply(&mut reader).await?);
            }
            anyhow::Ok(replies)
        };
        let (sent, replies) = tokio::join!(send, receive);
        sent?;
        replies
    };
    tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| anyhow::anyhow!("{addr}: no reply to a pipeline within {timeout:?}"))?
}

/// The slot ranges of the cluster and the address of the master serving each, as the node at
/// `addr` answers `CLUSTER SLOTS`.
pub async fn slot_owners(
    addr: std::net::SocketAddr,
    timeout: Duration,
) -> Result<Vec<(std::ops::RangeInclusive<u16>, std::net::SocketAddr)>> {
    let reply = command(addr, &[b"CLUSTER", b"SLOTS"], false, timeout).await?;
    let Reply::Array(ranges) = reply else {
        anyhow::bail!("{addr}: CLUSTER SLOTS answered {reply:?}");
    };
    let mut owners = Vec::new();
    for r in ranges {
        let parsed = match &r {
            Reply::Array(f) => match f.as_slice() {
                [Reply::Int(a), Reply::Int(b), Reply::Array(master), ..] => {
                    match master.as_slice() {
                        [Reply::Bulk(Some(ip)), Reply::Int(port), ..] => {
                            let ip: std::net::IpAddr = String::from_utf8_lossy(ip).parse()?;
                            Some((
                                u16::try_from(*a)?..=u16::try_from(*b)?,
                                std::net::SocketAddr::new(ip, u16::try_from(*port)?),
                            ))
                        }
                        _ => None,
                    }
                }
                _ => None,
            },
            _ => None,
        };
        owners.push(parsed.with_context(|| format!("{addr}: a CLUSTER SLOTS entry {r:?}"))?);
    }
    Ok(owners)
}

fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

fn read_reply<'a, R>(r: &'a mut R) -> futures::future::BoxFuture<'a, Result<Reply>>
where
    R: tokio::io::AsyncBufRead + Unpin + Send,
{
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    Box::pin(async move {
        let mut line = String::new();
        ensure!(r.read_line(&mut line).await? > 0, "connection closed");
        let line = line.trim_end_matches("\r\n");
        let (kind, rest) = line.split_at(1.min(line.len()));
        Ok(match kind {
            "+" => Reply::Simple(rest.to_owned()),
            "-" => Reply::Error(rest.to_owned()),
            ":" => Reply::Int(rest.parse()?),
            "$" => {
                let n: i64 = rest.parse()?;
                if n < 0 {
                    Reply::Bulk(None)
                } else {
                    let mut buf = vec![0; n as usize + 2];
                    r.read_exact(&mut buf).await?;
                    buf.truncate(n as usize);
                    Reply::Bulk(Some(buf))
                }
            }
            "*" => {
                let n: i64 = rest.parse()?;
                let mut items = Vec::new();
                for _ in 0..n.max(0) {
                    items.push(read_reply(r).await?);
                }
                Reply::Array(items)
            }
            _ => anyhow::bail!("not a Redis reply: {line:?}"),
        })
    })
}

/// Runs a keyed command as a cluster client does: sent to `entry`, then wherever `MOVED` or
/// `ASK` redirects it (at most 4 hops). Returns the reply and the node that gave it.
pub async fn cluster_command(
    entry: std::net::SocketAddr,
    args: &[&[u8]],
    timeout: Duration,
) -> Result<(Reply, std::net::SocketAddr)> {
    let mut addr = entry;
    let mut asking = false;
    for _ in 0..4 {
        match command(addr, args, asking, timeout).await? {
            Reply::Error(e) if e.starts_with("MOVED ") || e.starts_with("ASK ") => {
                asking = e.starts_with("ASK ");
                let to = e.rsplit(' ').next().unwrap_or_default();
                addr = to.parse().with_context(|| format!("redirect to {to:?}"))?;
            }
            reply => return Ok((reply, addr)),
        }
    }
    anyhow::bail!(
        "more than 4 redirections for {:?}",
        String::from_utf8_lossy(args[0])
    )
}

/// The hash slot of a key, as Redis Cluster computes it: CRC16 (XMODEM) of the key, or of its
/// `{hash tag}`, modulo 16384.
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let close = key[open + 1..].iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &key[open + 1..open + 1 + close])
    });
    let mut crc: u16 = 0;
    for &b in tagged.unwrap_or(key) {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// The slots a node serves, from its `CLUSTER NODES` text: the ranges on its `myself` line.
pub fn own_slots(nodes: &str) -> Vec<std::ops::RangeInclusive<u16>> {
    nodes
        .lines()
        .filter(|l| l.split(' ').nth(2).is_some_and(|f| f.contains("myself")))
        .flat_map(|l| l.split(' ').skip(8))
        .filter(|s| !s.starts_with('['))
        .filter_map(|s| match s.split_once('-') {
            Some((a, b)) => Some(a.parse().ok()?..=b.parse().ok()?),
            None => s.parse().ok().map(|a| a..=a),
        })
        .collect()
}

/// The drain pods' logs of some ordinals, followed from the test's side while each drain runs:
/// a drain pod's log goes with the pod when its drain ends, and a test that fails afterwards
/// (a member still listing a drained node) should show what each drain did.
pub struct DrainLogs {
    text: Arc<Mutex<String>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl DrainLogs {
    /// Follows the `drain` container of each drain pod of `ordinals` (every pod and every
    /// restart of its container) until dropped.
    pub fn follow(ns: &TestNamespace, ordinals: impl IntoIterator<Item = i32>) -> Self {
        let text = Arc::new(Mutex::new(String::new()));
        let tasks = pod_names(SET, ordinals)
            .into_iter()
            .map(|name| tokio::spawn(follow_drains(ns.api::<Pod>(), name, text.clone())))
            .collect();
        Self { text, tasks }
    }

    /// Every line followed so far, each after its pod's name.
    pub fn text(&self) -> String {
        self.text.lock().expect("drain logs").clone()
    }
}

impl Drop for DrainLogs {
    fn drop(&mut self) {
        self.tasks.iter().for_each(|t| t.abort());
    }
}

/// Follows the log of each run of the drain container of the drain pods named `name`.
async fn follow_drains(pods: kube::Api<Pod>, name: String, text: Arc<Mutex<String>>) {
    use futures::{AsyncBufReadExt, StreamExt};
    let mut followed = HashSet::new();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Ok(Some(pod)) = pods.get_opt(&name).await else {
            continue;
        };
        // A run of the container: its pod's UID and the container's restart count, once it
        // has started (a log is there to follow).
        let run = pod.status.as_ref().and_then(|s| {
            let c = s
                .container_statuses
                .as_ref()?
                .iter()
                .find(|c| c.name == "drain")?;
            let state = c.state.as_ref()?;
            (state.running.is_some() || state.terminated.is_some()).then_some(c.restart_count)
        });
        let (Some(restarts), Some(uid)) = (run, pod.metadata.uid.clone()) else {
            continue;
        };
        if !is_drain_pod(&pod) || !followed.insert((uid, restarts)) {
            continue;
        }
        let params = LogParams {
            container: Some("drain".into()),
            follow: true,
            ..LogParams::default()
        };
        let Ok(stream) = pods.log_stream(&name, &params).await else {
            continue;
        };
        let mut lines = stream.lines();
        while let Some(Ok(line)) = lines.next().await {
            let mut text = text.lock().expect("drain logs");
            text.push_str(&format!("{name} (run {restarts}): {line}\n"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_slots_are_the_ones_redis_computes() {
        // Each figure is what `redis-cli cluster keyslot` answers (Redis 7.0).
        for (key, slot) in [
            ("123456789", 12739),
            ("foo", 12182),
            ("bar", 5061),
            ("{}bar", 6479),
            ("foo{bar}{zap}", 5061),
            ("foo{{bar}}zap", 4015),
            ("{bar", 4015),
        ] {
            assert_eq!(key_slot(key.as_bytes()), slot, "{key}");
        }
    }

    #[test]
    fn own_slots_reads_the_myself_line() {
        let nodes = "a 10.0.0.1:6379@16379 master - 0 0 1 connected 0-10\n\
                     b 10.0.0.2:6379@16379 myself,master - 0 0 2 connected 11 20-30 [31->-a]\n";
        assert_eq!(own_slots(nodes), vec![11..=11, 20..=30]);
    }
}
