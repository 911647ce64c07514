//! Throughput and memory of `drainer redistribute` against a plain copy of the same bytes.
//!
//! `cargo bench -p drainer --bench throughput` (add `-- --quick` for 1/8 of the data). For each
//! shape (1 GiB as 10,000 records of 100 KiB; 1 GiB as 4 records of 256 MiB) it moves the same
//! files to two receivers on loopback, twice:
//! - **plain copy** (the baseline): raw TCP on persistent connections, 8 sender threads sending
//!   whole files with `std::io::copy` (sendfile on Linux); the receiver writes a temporary file,
//!   fsyncs it, renames it and fsyncs the directory (the datastore's durability) and acks;
//! - **drainer**: [`redistribute`] to two real datastore servers, 8 records in flight.
//!
//! Both senders run in a child process (this binary re-executed) that reports its own peak RSS
//! (`VmHWM`), so the figure is the sender's alone; the receivers run in this process. It prints
//! MiB/s of each (median of 3 alternating runs), the drainer's share of the plain copy (goal ≥ 80%) and the drainer's peak RSS
//! (goal < 64 MiB). Figures, not a pass/fail test.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use drainer::peers::{Peer, PeerSet, StaticPeers};
use drainer::placement;
use drainer::redistribute::{Options, redistribute};
use tokio::net::TcpListener;
use url::Url;

const CONCURRENCY: usize = 8;
/// Runs of each sender per shape.
const RUNS: usize = 3;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    if let Some(i) = args.iter().position(|a| a == "--child") {
        let mode = args[i + 1].clone();
        let dir = PathBuf::from(&args[i + 2]);
        let peers: Vec<String> = args[i + 3..i + 5].to_vec();
        rt.block_on(child(&mode, &dir, &peers));
        println!("{}", peak_rss_kib());
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let scale = if quick { 8 } else { 1 };
    println!("drainer throughput: 2 receivers on loopback, {CONCURRENCY} in flight, one machine");
    println!(
        "{:<34} {:>12} {:>12} {:>9} {:>16}",
        "shape", "plain MiB/s", "drain MiB/s", "share", "drainer peak RSS"
    );
    println!("(medians of {RUNS} alternating runs; peak RSS: the largest of the drainer runs)");
    for (label, count, size) in [
        ("10,000 records of 100 KiB", 10_000 / scale, 100 * 1024),
        ("4 records of 256 MiB", 4, (256 << 20) / scale),
    ] {
        // Alternating runs, the median of each: the disk is shared and noisy.
        let (mut plains, mut drains, mut rss) = (Vec::new(), Vec::new(), 0);
        for _ in 0..RUNS {
            plains.push(rt.block_on(run("plain", count, size)).0);
            let (d, r) = rt.block_on(run("drainer", count, size));
            drains.push(d);
            rss = rss.max(r);
        }
        let (plain, drain) = (median(plains), median(drains));
        let total = (count * size) as f64 / (1 << 20) as f64;
        let (p, d) = (total / plain.as_secs_f64(), total / drain.as_secs_f64());
        println!(
            "{:<34} {:>12.1} {:>12.1} {:>8.0}% {:>12.1} MiB",
            format!("{label} ({total:.0} MiB)"),
            p,
            d,
            100.0 * d / p,
            rss as f64 / 1024.0
        );
    }
}

/// Writes the records, starts the receivers, runs the child sender; returns its wall time and
/// peak RSS in KiB.
async fn run(mode: &str, count: usize, size: usize) -> (Duration, u64) {
    let source = tempfile::tempdir().expect("tempdir");
    write_records(source.path(), count, size);
    let sinks = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut addrs = Vec::new();
    for (i, sink) in sinks.iter().enumerate() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.push(listener.local_addr().unwrap());
        let dir = sink.path().to_path_buf();
        if mode == "plain" {
            tokio::spawn(plain_receiver(listener, dir));
        } else {
            let store = datastore::Store::open_as(&dir, &format!("peer-{i}")).unwrap();
            tokio::spawn(datastore::http::serve(
                listener,
                store,
                std::future::pending(),
            ));
        }
    }
    sync_all();
    let started = Instant::now();
    let out = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--child", mode])
        .arg(source.path())
        .args(addrs.iter().map(SocketAddr::to_string))
        .stderr(std::process::Stdio::inherit())
        .output()
        .await
        .expect("child");
    let elapsed = started.elapsed();
    assert!(out.status.success(), "{mode} sender failed");
    let rss: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("child prints its peak RSS");
    let received: usize = sinks
        .iter()
        .map(|s| std::fs::read_dir(s.path()).unwrap().count())
        .sum();
    assert_eq!(received, count, "{mode}: every record arrived");
    (elapsed, rss)
}

fn sync_all() {
    nix::unistd::sync();
}

/// This process's peak resident memory (`VmHWM`), in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn write_records(dir: &Path, count: usize, size: usize) {
    let chunk: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 7 + 3) as u8).collect();
    for i in 0..count {
        let mut file =
            std::io::BufWriter::new(std::fs::File::create(dir.join(format!("r{i:05}"))).unwrap());
        let mut left = size;
        while left > 0 {
            let n = left.min(chunk.len());
            file.write_all(&chunk[..n]).unwrap();
            left -= n;
        }
        file.flush().unwrap();
    }
}

/// The sender, in the child process.
async fn child(mode: &str, dir: &Path, peers: &[String]) {
    let addrs: Vec<SocketAddr> = peers.iter().map(|p| p.parse().unwrap()).collect();
    if mode == "plain" {
        plain_send(dir, &addrs).await;
        return;
    }
    let set = PeerSet::all_ready(addrs.iter().enumerate().map(|(o, a)| {
        Peer::new(
            o as i32,
            format!("peer-{o}"),
            Url::parse(&format!("http://{a}/")).unwrap(),
        )
    }));
    let options = Options {
        allow_unmounted: true,
        concurrency: CONCURRENCY,
        progress_interval: Duration::from_secs(3600),
        ..Options::new(dir)
    };
    redistribute(&options, &StaticPeers(set))
        .await
        .expect("redistribute");
}

/// The plain copy: `CONCURRENCY` threads, each with a persistent connection to each receiver,
/// sending whole files with `std::io::copy` (sendfile/splice on Linux) and waiting for each ack.
async fn plain_send(dir: &Path, addrs: &[SocketAddr]) {
    use std::io::Read;
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let queue = std::sync::Mutex::new(names.into_iter());
    std::thread::scope(|scope| {
        for _ in 0..CONCURRENCY {
            scope.spawn(|| {
                let mut conns: Vec<std::net::TcpStream> = addrs
                    .iter()
                    .map(|a| {
                        let c = std::net::TcpStream::connect(a).unwrap();
                        c.set_nodelay(true).unwrap();
                        c
                    })
                    .collect();
                loop {
                    let Some(name) = queue.lock().unwrap().next() else {
                        return;
                    };
                    let conn = &mut conns[placement::owner(&name, &[0, 1]) as usize];
                    let mut file = std::fs::File::open(dir.join(&name)).unwrap();
                    let len = file.metadata().unwrap().len();
                    conn.write_all(&(name.len() as u16).to_be_bytes()).unwrap();
                    conn.write_all(name.as_bytes()).unwrap();
                    conn.write_all(&len.to_be_bytes()).unwrap();
                    assert_eq!(std::io::copy(&mut file, conn).unwrap(), len);
                    let mut ack = [0u8; 1];
                    conn.read_exact(&mut ack).unwrap();
                    std::fs::remove_file(dir.join(&name)).unwrap();
                }
            });
        }
    });
}

/// Receives files on persistent connections: name, length, bytes; writes each durably like the
/// datastore (temporary file, fsync, rename, fsync of the directory); acks with one byte.
async fn plain_receiver(listener: TcpListener, dir: PathBuf) {
    loop {
        let (stream, _) = listener.accept().await.unwrap();
        let mut stream = stream.into_std().unwrap();
        stream.set_nonblocking(false).unwrap();
        stream.set_nodelay(true).unwrap();
        let dir = dir.clone();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let mut n = [0u8; 2];
                if stream.read_exact(&mut n).is_err() {
                    return;
                }
                let mut name = vec![0; u16::from_be_bytes(n) as usize];
                stream.read_exact(&mut name).unwrap();
                let name = String::from_utf8(name).unwrap();
                let mut len = [0u8; 8];
                stream.read_exact(&mut len).unwrap();
                let mut left = u64::from_be_bytes(len);
                let tmp = dir.join(format!(".tmp-{name}"));
                let mut file = std::fs::File::create(&tmp).unwrap();
                while left > 0 {
                    let want = left.min(buf.len() as u64) as usize;
                    let got = stream.read(&mut buf[..want]).unwrap();
                    assert!(got > 0, "sender hung up mid-file");
                    file.write_all(&buf[..got]).unwrap();
                    left -= got as u64;
                }
                file.sync_all().unwrap();
                std::fs::rename(&tmp, dir.join(&name)).unwrap();
                std::fs::File::open(&dir).unwrap().sync_all().unwrap();
                stream.write_all(&[1]).unwrap();
            }
        });
    }
}
