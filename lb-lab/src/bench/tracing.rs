//! `bench --trace`: the tierlb rows with `tierlb trace` consuming every decision, for connect4's cost with
//! tracing on.
use std::{
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use lb_testkit::sandbox::{Child, TempDir};

/// `bench --trace`: the data path's maps pinned on a private bpffs, where `tierlb trace` finds them.
pub(super) struct Tracing {
    bpffs: lb_testkit::sandbox::BpfFs,
    pins: std::path::PathBuf,
}

/// A running `tierlb trace -o json` whose events go to /dev/null; ended on drop, printing its summary (events,
/// missed).
pub(super) struct Tracer {
    child: Child,
    dir: TempDir,
}

impl Tracing {
    pub(super) fn new() -> anyhow::Result<Self> {
        let bpffs = lb_testkit::sandbox::BpfFs::new("bench")?;
        let pins = bpffs.path().join("bench");
        std::fs::create_dir_all(&pins)?;
        Ok(Self { bpffs, pins })
    }

    pub(super) fn pins(&self) -> &Path {
        &self.pins
    }

    /// Tracing on, with a consumer, until the `Tracer` is dropped.
    pub(super) fn start(&self, tierlb: &Path) -> anyhow::Result<Tracer> {
        let dir = TempDir::new("bench-trace")?;
        let log = dir.path().join("trace.err");
        let mut cmd = Command::new(tierlb);
        cmd.args(["trace", "-o", "json", "--bpffs"])
            .arg(self.bpffs.path())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?);
        let mut child = Child::spawn(&mut cmd)?;
        child.wait_for_log(&log, 0, "tierlb trace: tracing", Duration::from_secs(10))?;
        Ok(Tracer { child, dir })
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        self.child.stop(Duration::from_secs(5));
        let summary = std::fs::read_to_string(self.dir.path().join("trace.err")).unwrap_or_default();
        eprintln!("bench: tracing on for the tierlb rows: {}", summary.lines().last().unwrap_or_default());
    }
}
