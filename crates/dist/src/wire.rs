//! The rendezvous store's wire protocol: each message is a 4-byte big-endian length followed
//! by that many bytes of JSON (one [`Request`] or [`Reply`]). A connection starts with
//! [`Request::Hello`]; the store answers [`Reply::Welcome`] or [`Reply::Rejected`]. Store
//! connections then carry request/reply pairs; heartbeat connections carry
//! [`Request::Heartbeat`] / [`Request::Bye`] and their replies.

use crate::error::{DistError, Result};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};

/// Largest message accepted (a corrupt or foreign peer cannot make us allocate more).
pub const MAX_MESSAGE: usize = 64 << 20;

/// What a connection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    /// Key-value requests and collectives.
    Store,
    /// The rank's liveness connection (one per rank).
    Heartbeat,
}

/// Messages from a rank to the store.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    Hello {
        job: String,
        rank: usize,
        world_size: usize,
        kind: Kind,
    },
    Set {
        key: String,
        value: Vec<u8>,
    },
    Get {
        key: String,
    },
    /// Blocks until `key` exists, `timeout_ms` passes, or a rank dies.
    Wait {
        key: String,
        timeout_ms: u64,
    },
    /// Contributes `value` to the gather `name`; blocks until every rank contributed (or the
    /// timeout, or a death). `timeout_ms` 0 waits without limit.
    Gather {
        name: String,
        value: Vec<u8>,
        timeout_ms: u64,
    },
    /// The operation this rank is in, named in peers' errors if it dies.
    SetOp {
        op: String,
    },
    Heartbeat,
    /// A clean goodbye on the heartbeat connection: closing it is not a death.
    Bye,
}

/// Messages from the store to a rank.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Reply {
    Welcome,
    Rejected {
        reason: String,
    },
    Ok,
    Value {
        value: Option<Vec<u8>>,
    },
    Gathered {
        values: Vec<Vec<u8>>,
    },
    /// A wait or gather timed out; `missing` are the ranks that had not contributed.
    Timeout {
        missing: Vec<usize>,
    },
    /// Heartbeat answer: everyone alive; `rank0_op` is what rank 0 last announced.
    Alive {
        rank0_op: String,
    },
    /// A rank died; `op` is the operation it had announced ("" when none).
    Dead {
        rank: usize,
        op: String,
    },
}

/// Writes one message.
pub fn send<T: Serialize>(w: &mut impl Write, msg: &T) -> Result<()> {
    let body = serde_json::to_vec(msg).map_err(|e| DistError::Protocol(e.to_string()))?;
    if body.len() > MAX_MESSAGE {
        return Err(DistError::Protocol(format!(
            "message of {} bytes exceeds the {MAX_MESSAGE}-byte limit",
            body.len()
        )));
    }
    let len = (body.len() as u32).to_be_bytes();
    w.write_all(&len)?;
    w.write_all(&body)?;
    w.flush()?;
    Ok(())
}

/// Reads one message; `Ok(None)` when the peer closed the connection between messages.
pub fn recv<T: for<'de> Deserialize<'de>>(r: &mut impl Read) -> Result<Option<T>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let n = u32::from_be_bytes(len) as usize;
    if n > MAX_MESSAGE {
        return Err(DistError::Protocol(format!(
            "peer announced a {n}-byte message (limit {MAX_MESSAGE}): not a ptxforge rendezvous store"
        )));
    }
    let mut body = vec![0u8; n];
    r.read_exact(&mut body)?;
    serde_json::from_slice(&body)
        .map(Some)
        .map_err(|e| DistError::Protocol(format!("bad message: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_oversize_is_refused() {
        let mut buf = Vec::new();
        let req = Request::Gather {
            name: "x".into(),
            value: vec![1, 2, 250],
            timeout_ms: 7,
        };
        send(&mut buf, &req).unwrap();
        let back: Request = recv(&mut buf.as_slice()).unwrap().unwrap();
        assert!(
            matches!(back, Request::Gather { value, timeout_ms: 7, .. } if value == [1, 2, 250])
        );
        let empty: Option<Request> = recv(&mut [].as_slice()).unwrap();
        assert!(empty.is_none());
        let huge = (u32::MAX).to_be_bytes();
        let e = recv::<Request>(&mut huge.as_slice()).unwrap_err();
        assert!(e.to_string().contains("limit"), "{e}");
        let junk = [0, 0, 0, 2, b'{', b'x'];
        assert!(recv::<Request>(&mut junk.as_slice()).is_err());
    }
}
