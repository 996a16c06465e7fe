//! Graph capture and replay: `stream.begin_capture()`, launches, `stream.end_capture()` gives a
//! [`Graph`] that `graph.launch(&stream)` replays. CUDA: `cuStreamBeginCapture` /
//! `cuStreamEndCapture` / `cuGraphInstantiate` / `cuGraphLaunch`. Emulator: the launches are
//! recorded (arguments checked at capture time) and replayed in order.

use crate::cuda::launch::CuGraph;
use crate::device::Function;
use crate::stream::{LaunchConfig, Stream};
use crate::{Arg, Result, RuntimeError};

/// One captured launch (emulator).
#[derive(Clone)]
pub(crate) struct Recorded {
    pub f: Function,
    pub cfg: LaunchConfig,
    pub args: Vec<Arg>,
}

enum GraphInner {
    Emu(Vec<Recorded>),
    Cuda(CuGraph),
}

/// A captured sequence of launches, replayable any number of times.
pub struct Graph {
    inner: GraphInner,
}

impl Graph {
    /// Number of captured launches (emulator; `None` on CUDA, where the driver owns the graph).
    pub fn len(&self) -> Option<usize> {
        match &self.inner {
            GraphInner::Emu(v) => Some(v.len()),
            GraphInner::Cuda(_) => None,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == Some(0)
    }

    /// Replays the graph on `stream` (asynchronously, like a launch).
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        match &self.inner {
            GraphInner::Emu(v) => {
                for r in v {
                    stream.launch(&r.f, &r.cfg, &r.args)?;
                }
                Ok(())
            }
            GraphInner::Cuda(g) => match &stream.inner.cuda {
                Some(Ok(cs)) => g.launch(cs),
                Some(Err(e)) => Err(e.clone()),
                None => Err(RuntimeError::Launch(
                    "a CUDA graph cannot run on an emulator stream".into(),
                )),
            },
        }
    }
}

impl Stream {
    /// Starts capturing: launches on this stream are recorded into a graph instead of running
    /// (until [`Stream::end_capture`]).
    pub fn begin_capture(&self) -> Result<()> {
        let mut cap = self.inner.capture.lock().unwrap_or_else(|p| p.into_inner());
        if cap.is_some() {
            return Err(RuntimeError::Launch("stream is already capturing".into()));
        }
        if let Some(cs) = &self.inner.cuda {
            CuGraph::begin_capture(cs.as_ref().map_err(|e| e.clone())?)?;
            // CUDA records in the driver; the emulator list stays empty but marks the state.
            *cap = Some(Vec::new());
            return Ok(());
        }
        *cap = Some(Vec::new());
        Ok(())
    }

    /// Whether this stream is capturing.
    pub fn is_capturing(&self) -> bool {
        self.inner
            .capture
            .lock()
            .map(|c| c.is_some())
            .unwrap_or(false)
    }

    /// Ends the capture and returns the instantiated graph.
    pub fn end_capture(&self) -> Result<Graph> {
        let mut cap = self.inner.capture.lock().unwrap_or_else(|p| p.into_inner());
        let recorded = cap
            .take()
            .ok_or_else(|| RuntimeError::Launch("end_capture without begin_capture".into()))?;
        if let Some(cs) = &self.inner.cuda {
            let g = CuGraph::end_capture(cs.as_ref().map_err(|e| e.clone())?)?;
            return Ok(Graph {
                inner: GraphInner::Cuda(g),
            });
        }
        Ok(Graph {
            inner: GraphInner::Emu(recorded),
        })
    }
}
