//! The scale charts `--report` writes beside the latency ones: connect4's cost per call and the time to
//! program N Services (tierlb's maps, iptables-restore, nft -f) against N; and the agent's control plane
//! (start to ready, RSS) against N, from manifests and from the API server.
use tierlb::chart::{ChartError, Legend, Line, LineChart, line_chart, okabe_ito};

use super::{
    figures::{AgentSource, DataPath, LoadTime, Report},
    load::LoadMode,
};

/// The Service counts the x axis spans (log scale).
const SERVICES: std::ops::Range<f64> = 1.0..100_000.0;

fn frame<'a>(title: &'a str, y_desc: &'a str, ymax: f64) -> LineChart<'a> {
    LineChart {
        title,
        size: (760, 440),
        x_desc: "Services programmed (log scale)",
        y_desc,
        x: SERVICES,
        log_x: true,
        y: 0.0..(ymax * 1.2).max(1.0),
        x_decimals: 0,
        // Seconds below 10 need a decimal to tell their ticks apart.
        y_decimals: usize::from(ymax < 10.0),
        legend: Legend::UpperLeft,
    }
}

fn line(name: &str, mut points: Vec<(f64, f64)>, colour: tierlb::chart::Rgb) -> Line {
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    Line { name: name.to_owned(), points, colour, dashed: false, markers: true }
}

/// Series with something to draw (a path without figures in this run is left out of the legend).
fn drawn(lines: Vec<Line>) -> Vec<Line> {
    lines.into_iter().filter(|l| !l.points.is_empty()).collect()
}

fn ymax(lines: &[Line]) -> f64 {
    lines.iter().flat_map(|l| l.points.iter().map(|p| p.1)).fold(0.0, f64::max)
}

/// connect4's BPF cost per call (bpf_stats) against the number of Services, per load mode.
fn connect4_cost(r: &Report) -> Result<String, ChartError> {
    let lines: Vec<Line> = LoadMode::ALL
        .iter()
        .zip([okabe_ito::BLUE, okabe_ito::SKY_BLUE])
        .map(|(mode, colour)| {
            let points = r
                .rows
                .iter()
                .filter(|x| x.path == DataPath::Tierlb && x.mode == *mode)
                .filter_map(|x| Some((x.services as f64, x.bpf_ns_per_run?)))
                .collect();
            line(&format!("connect4 per call, {}", mode.title()), points, colour)
        })
        .collect();
    let lines = drawn(lines);
    line_chart(
        &frame("tierlb's connect4: BPF time per call", "ns per call (bpf_stats)", ymax(&lines)),
        &lines,
    )
}

/// Time to program N Services: tierlb's maps from scratch, and the kube-proxy-style rule sets' loads (a
/// load stopped at the limit is left out; the report's table says so).
fn program_time(r: &Report) -> Result<String, ChartError> {
    let mut lines = vec![line(
        "tierlb maps (from scratch)",
        r.control.maps.iter().map(|m| (m.services as f64, m.program.as_secs_f64())).collect(),
        okabe_ito::BLUE,
    )];
    for (tool, colour) in [("iptables-restore", okabe_ito::VERMILLION), ("nft -f", okabe_ito::GREEN)] {
        let points = r
            .control
            .rule_loads
            .iter()
            .filter(|l| l.tool == tool)
            .filter_map(|l| match l.took {
                LoadTime::Done(d) => Some((l.services as f64, d.as_secs_f64())),
                LoadTime::Stopped { .. } => None,
            })
            .collect();
        lines.push(line(tool, points, colour));
    }
    let lines = drawn(lines);
    line_chart(&frame("Time to program N Services x 10 endpoints", "seconds", ymax(&lines)), &lines)
}

/// The agent's start to ready, or its RSS, against N, per source.
fn agent_chart(
    r: &Report,
    title: &str,
    y_desc: &str,
    f: fn(&super::figures::AgentFigures) -> f64,
) -> Result<String, ChartError> {
    let lines: Vec<Line> = AgentSource::ALL
        .iter()
        .zip([okabe_ito::BLUE, okabe_ito::ORANGE, okabe_ito::GREEN])
        .map(|(source, colour)| {
            let points = r
                .control
                .agent
                .iter()
                .filter(|a| a.source == *source)
                .map(|a| (a.services as f64, f(a)))
                .collect();
            line(&format!("agent, {}", source.as_str()), points, colour)
        })
        .collect();
    let lines = drawn(lines);
    line_chart(&frame(title, y_desc, ymax(&lines)), &lines)
}

/// The scale and control-plane charts: (file name under bench/, SVG).
pub(super) fn scale_charts(r: &Report) -> Result<Vec<(String, String)>, ChartError> {
    Ok(vec![
        ("scale-connect4.svg".into(), connect4_cost(r)?),
        ("scale-program.svg".into(), program_time(r)?),
        (
            "control-ready.svg".into(),
            agent_chart(r, "Agent start to ready", "seconds", |a| a.ready.as_secs_f64())?,
        ),
        (
            "control-rss.svg".into(),
            agent_chart(r, "Agent resident memory after 20 edits", "MiB (VmRSS)", |a| {
                a.rss_bytes as f64 / 1_048_576.0
            })?,
        ),
    ])
}
