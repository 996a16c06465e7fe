//! Inter-node engines: what moves a proxy's one-sided operations between processes.
//!
//! An [`Engine`] connects the proxy endpoints of a job (one per process; in tests several in one
//! process). It carries three operations, modelled on NVSHMEM's `put` + `signal` and a
//! `quiet`/barrier: [`Op::Put`] (bytes into a window at an offset), [`Op::Signal`] (a release
//! store of a 32-bit counter: a ring's tail or head) and [`Op::Fence`] (everything this endpoint
//! sent before it has been applied). The one ordering guarantee every engine gives: messages
//! from one endpoint to another are delivered **in the order they were sent** (MPI's
//! non-overtaking rule on one communicator and tag; FIFO channels in process). A put therefore
//! lands before the signal sent after it, as an RDMA write before a fenced flag update.
//!
//! [`InProcessEngine`] connects endpoints of one process with channels (unit tests without
//! MPI); [`crate::mesh::MeshEngine`] connects processes over TCP (any launcher); the MPI engine
//! is in the `netmpi` crate; all carry the same [`Msg`] (byte engines use [`Msg::encode`] /
//! [`Msg::decode`]).

use crate::{EpError, Result};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::Mutex;

/// Which window a message is applied to: rank `owner`'s real window `key`, or (`shadow`) the
/// send window that rank `src` writes for it (heads flow back there).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    pub key: u32,
    pub owner: u32,
    pub src: u32,
    pub shadow: bool,
}

/// One operation of the proxy protocol.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Bytes written at `offset` of the target window (plain stores).
    Put { offset: u64, data: Vec<u8> },
    /// Release store of `value` into the u32 at `offset` (after every earlier put).
    Signal { offset: u64, value: u32 },
    /// Every message sent before it by this endpoint has been applied. `phase` tells the
    /// fences of one operation apart (begin, end).
    Fence { phase: u32 },
    /// One endpoint's part of an all-gather number `seq` (bootstrap-time exchanges such as the
    /// dispatch's per-expert token counts).
    Blob { seq: u32, data: Vec<u8> },
}

/// A message between proxy endpoints.
#[derive(Clone, Debug, PartialEq)]
pub struct Msg {
    /// Operation counter of the sender: messages of older operations are dropped.
    pub epoch: u32,
    /// Sending endpoint (process).
    pub from: u32,
    pub target: Target,
    pub op: Op,
}

const KIND_PUT: u8 = 1;
const KIND_SIGNAL: u8 = 2;
const KIND_FENCE: u8 = 3;
const KIND_BLOB: u8 = 4;
/// Bytes of the fixed header of an encoded message.
pub const HEADER_BYTES: usize = 40;

impl Msg {
    /// Wire format: kind u8, shadow u8, 2 pad, epoch, from, key, owner, src (u32 LE),
    /// offset u64, value u32, pad u32, then the put's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let (kind, offset, value, data): (u8, u64, u32, &[u8]) = match &self.op {
            Op::Put { offset, data } => (KIND_PUT, *offset, 0, data),
            Op::Signal { offset, value } => (KIND_SIGNAL, *offset, *value, &[]),
            Op::Fence { phase } => (KIND_FENCE, 0, *phase, &[]),
            Op::Blob { seq, data } => (KIND_BLOB, 0, *seq, data),
        };
        let mut b = Vec::with_capacity(HEADER_BYTES + data.len());
        b.extend_from_slice(&[kind, self.target.shadow as u8, 0, 0]);
        for v in [
            self.epoch,
            self.from,
            self.target.key,
            self.target.owner,
            self.target.src,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&offset.to_le_bytes());
        b.extend_from_slice(&value.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(data);
        b
    }

    /// Inverse of [`Msg::encode`]; a malformed message is an [`EpError::Engine`].
    pub fn decode(b: &[u8]) -> Result<Msg> {
        if b.len() < HEADER_BYTES {
            return Err(EpError::Engine(format!(
                "message of {} bytes is shorter than its {HEADER_BYTES}-byte header",
                b.len()
            )));
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut o = [0u8; 8];
        o.copy_from_slice(&b[24..32]);
        let offset = u64::from_le_bytes(o);
        let value = u32_at(32);
        let op = match b[0] {
            KIND_PUT => Op::Put {
                offset,
                data: b[HEADER_BYTES..].to_vec(),
            },
            KIND_SIGNAL => Op::Signal { offset, value },
            KIND_FENCE => Op::Fence { phase: value },
            KIND_BLOB => Op::Blob {
                seq: value,
                data: b[HEADER_BYTES..].to_vec(),
            },
            k => return Err(EpError::Engine(format!("unknown message kind {k}"))),
        };
        Ok(Msg {
            epoch: u32_at(4),
            from: u32_at(8),
            target: Target {
                key: u32_at(12),
                owner: u32_at(16),
                src: u32_at(20),
                shadow: b[1] != 0,
            },
            op,
        })
    }
}

/// The target of messages that address no window (fences, all-gather parts).
pub const NO_TARGET: Target = Target {
    key: 0,
    owner: 0,
    src: 0,
    shadow: false,
};

/// Moves [`Msg`]s between the endpoints of a job, in order per (sender, receiver) pair.
pub trait Engine: Send + Sync {
    /// This endpoint's index.
    fn endpoint(&self) -> u32;
    /// Endpoints in the job.
    fn endpoints(&self) -> u32;
    /// Queues `msg` for endpoint `to` (never blocks on the receiver applying it).
    fn send(&self, to: u32, msg: Msg) -> Result<()>;
    /// The next message for this endpoint, if one has arrived.
    fn poll(&self) -> Result<Option<Msg>>;
    fn name(&self) -> &'static str;

    /// `put(dst, offset, bytes)`: bytes into the target window.
    fn put(&self, to: u32, epoch: u32, target: Target, offset: u64, data: Vec<u8>) -> Result<()> {
        let from = self.endpoint();
        let op = Op::Put { offset, data };
        self.send(
            to,
            Msg {
                epoch,
                from,
                target,
                op,
            },
        )
    }
    /// `signal(dst, offset, value)`: release store after every earlier put to `to`.
    fn signal(&self, to: u32, epoch: u32, target: Target, offset: u64, value: u32) -> Result<()> {
        let from = self.endpoint();
        let op = Op::Signal { offset, value };
        self.send(
            to,
            Msg {
                epoch,
                from,
                target,
                op,
            },
        )
    }
    /// A fence of `phase` to endpoint `to`.
    fn fence(&self, to: u32, epoch: u32, phase: u32) -> Result<()> {
        let from = self.endpoint();
        let op = Op::Fence { phase };
        let target = NO_TARGET;
        self.send(
            to,
            Msg {
                epoch,
                from,
                target,
                op,
            },
        )
    }
    /// This endpoint's part `data` of all-gather `seq`, to endpoint `to`.
    fn blob(&self, to: u32, seq: u32, data: Vec<u8>) -> Result<()> {
        let from = self.endpoint();
        let op = Op::Blob { seq, data };
        let (epoch, target) = (0, NO_TARGET);
        self.send(
            to,
            Msg {
                epoch,
                from,
                target,
                op,
            },
        )
    }
}

/// Endpoints of one process joined by channels (FIFO per pair, like MPI point-to-point).
pub struct InProcessEngine {
    me: u32,
    peers: Vec<Sender<Msg>>,
    inbox: Mutex<Receiver<Msg>>,
}

impl InProcessEngine {
    /// `n` connected endpoints (index = endpoint id).
    pub fn mesh(n: u32) -> Vec<InProcessEngine> {
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| channel::<Msg>()).unzip();
        rxs.into_iter()
            .enumerate()
            .map(|(i, rx)| InProcessEngine {
                me: i as u32,
                peers: txs.clone(),
                inbox: Mutex::new(rx),
            })
            .collect()
    }
}

impl Engine for InProcessEngine {
    fn endpoint(&self) -> u32 {
        self.me
    }
    fn endpoints(&self) -> u32 {
        self.peers.len() as u32
    }
    fn send(&self, to: u32, msg: Msg) -> Result<()> {
        let tx = self
            .peers
            .get(to as usize)
            .ok_or_else(|| EpError::Engine(format!("no endpoint {to}")))?;
        tx.send(msg)
            .map_err(|_| EpError::Engine(format!("endpoint {to} has shut down")))
    }
    fn poll(&self) -> Result<Option<Msg>> {
        let rx = self
            .inbox
            .lock()
            .map_err(|_| EpError::Engine("inbox lock poisoned".into()))?;
        match rx.try_recv() {
            Ok(m) => Ok(Some(m)),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(EpError::Engine("all senders gone".into())),
        }
    }
    fn name(&self) -> &'static str {
        "in-process channels"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_through_the_wire_format() {
        let t = Target {
            key: 3,
            owner: 7,
            src: 2,
            shadow: true,
        };
        let ops = [
            Op::Put {
                offset: 0x1_0000_0010,
                data: vec![1, 2, 3, 250],
            },
            Op::Signal {
                offset: 64,
                value: 0x8000_0005,
            },
            Op::Fence { phase: 1 },
            Op::Blob {
                seq: 4,
                data: vec![9; 17],
            },
        ];
        for op in ops {
            let m = Msg {
                epoch: 9,
                from: 1,
                target: t,
                op,
            };
            assert_eq!(Msg::decode(&m.encode()).unwrap(), m);
        }
        assert!(Msg::decode(&[1, 2, 3]).is_err());
    }

    #[test]
    fn in_process_endpoints_deliver_in_order() {
        let e = InProcessEngine::mesh(2);
        let t = Target {
            key: 0,
            owner: 1,
            src: 0,
            shadow: false,
        };
        for v in 0..100u32 {
            e[0].signal(1, 0, t, 4, v).unwrap();
        }
        for v in 0..100u32 {
            let m = e[1].poll().unwrap().unwrap();
            assert_eq!(
                m.op,
                Op::Signal {
                    offset: 4,
                    value: v
                }
            );
            assert_eq!(m.from, 0);
        }
        assert!(e[1].poll().unwrap().is_none());
        assert!(e[0]
            .send(
                5,
                e[1].poll().unwrap().unwrap_or(Msg {
                    epoch: 0,
                    from: 0,
                    target: t,
                    op: Op::Fence { phase: 0 }
                })
            )
            .is_err());
    }
}
