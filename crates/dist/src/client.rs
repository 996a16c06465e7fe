//! A rank's side of the store connections: connect with retries and backoff until the
//! bootstrap deadline (ranks and the store may start in any order), say hello, then
//! request/reply.

use crate::env::DistEnv;
use crate::error::{DistError, Result};
use crate::server::resolve;
use crate::wire::{recv, send, Kind, Reply, Request};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// First retry delay; doubled after each failed attempt up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_millis(500);
/// Longest single connect attempt (an unreachable host may not answer at all).
const ATTEMPT: Duration = Duration::from_secs(5);

/// Connects to the store and joins as `kind`, retrying until `deadline`.
pub fn connect(env: &DistEnv, kind: Kind, deadline: Instant) -> Result<TcpStream> {
    let start = Instant::now();
    let mut backoff = FIRST_BACKOFF;
    loop {
        let last_error = match attempt(env, kind, deadline) {
            Ok(s) => return Ok(s),
            Err(e @ DistError::Rejected { .. }) | Err(e @ DistError::Resolve { .. }) => {
                return Err(e)
            }
            Err(e) => e.to_string(),
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(DistError::MasterUnreachable {
                rank: env.rank,
                addr: env.master(),
                waited: now - start,
                last_error,
            });
        }
        std::thread::sleep(backoff.min(deadline - now));
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

fn attempt(env: &DistEnv, kind: Kind, deadline: Instant) -> Result<TcpStream> {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(10));
    let mut last = None;
    for addr in resolve(env)? {
        match TcpStream::connect_timeout(&addr, left.min(ATTEMPT)) {
            Ok(s) => return hello(env, kind, s, left),
            Err(e) => last = Some(e),
        }
    }
    Err(last.map_or_else(|| DistError::Protocol("no address".into()), DistError::Io))
}

fn hello(env: &DistEnv, kind: Kind, mut s: TcpStream, left: Duration) -> Result<TcpStream> {
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(left.min(ATTEMPT)))?;
    let hi = Request::Hello {
        job: env.job_id.clone(),
        rank: env.rank,
        world_size: env.world_size,
        kind,
    };
    send(&mut s, &hi)?;
    match recv::<Reply>(&mut s)? {
        Some(Reply::Welcome) => {
            s.set_read_timeout(None)?;
            Ok(s)
        }
        Some(Reply::Rejected { reason }) => Err(DistError::Rejected {
            rank: env.rank,
            addr: env.master(),
            reason,
        }),
        Some(other) => Err(DistError::Protocol(format!(
            "unexpected answer to hello: {other:?}"
        ))),
        None => Err(DistError::Protocol(
            "the listener closed the connection during hello".into(),
        )),
    }
}

/// Sends one request and reads its reply; `Ok(None)` when the store closed the connection.
pub fn request(s: &mut TcpStream, req: &Request) -> Result<Option<Reply>> {
    send(s, req)?;
    recv(s)
}
