//! The charts `--report` writes under bench/: p50 latency against the number of Services, one per load mode,
//! and the scale and control-plane charts (`scale_charts`).
use std::ops::Range;

use tierlb::chart::{ChartError, Legend, Line, LineChart, Rgb, line_chart, okabe_ito};

use super::{
    figures::{DataPath, Report},
    load::LoadMode,
};

/// The charts `--report` writes: (file name under bench/, SVG).
pub fn charts(r: &Report) -> Result<Vec<(String, String)>, ChartError> {
    let mut out: Vec<(String, String)> = LoadMode::ALL
        .iter()
        .map(|m| Ok((format!("latency-{}.svg", m.as_str()), latency_chart(r, *m)?)))
        .collect::<Result<_, ChartError>>()?;
    out.extend(super::scale_charts::scale_charts(r)?);
    Ok(out)
}

/// A data path's colour in the charts, from Okabe and Ito's colour-blind-safe palette (the former
/// red/green pair for iptables/nftables is the one most readers with a deficiency cannot tell apart).
fn colour(path: DataPath) -> Rgb {
    match path {
        DataPath::Direct => okabe_ito::BLACK,
        DataPath::Tierlb | DataPath::TierlbDsr => okabe_ito::BLUE,
        DataPath::Iptables => okabe_ito::VERMILLION,
        DataPath::Nftables => okabe_ito::GREEN,
        DataPath::KubeProxyIptables => okabe_ito::ORANGE,
        DataPath::KubeProxyNftables => okabe_ito::PURPLE,
        DataPath::TierlbXdp | DataPath::TierlbXdpDsr => okabe_ito::SKY_BLUE,
    }
}

/// The Service counts the x axis spans (log scale).
const SERVICES: Range<f64> = 1.0..100_000.0;

/// p50 latency against the number of Services (log scale) for each data path, with direct as the floor
/// across the whole axis.
fn latency_chart(r: &Report, mode: LoadMode) -> Result<String, ChartError> {
    let mut lines = Vec::new();
    for path in DataPath::ALL.into_iter().chain(DataPath::KUBE_PROXY) {
        let line = |name: &str, points, markers| Line {
            name: name.to_owned(),
            points,
            colour: colour(path),
            // The floor is a reference level, not a measured series: dashed.
            dashed: path == DataPath::Direct,
            markers,
        };
        if path == DataPath::Direct {
            let Some(d) = r.row(DataPath::Direct, 0, mode) else { continue };
            let floor = vec![(SERVICES.start, d.result.p50_us), (SERVICES.end, d.result.p50_us)];
            lines.push(line("direct (pod IP, the floor)", floor, false));
        } else {
            let mut points: Vec<(f64, f64)> = r
                .rows
                .iter()
                .filter(|x| x.path == path && x.mode == mode && x.services > 0)
                .map(|x| (x.services as f64, x.result.p50_us))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            lines.push(line(path.as_str(), points, true));
        }
    }
    let ymax = r.rows.iter().filter(|x| x.mode == mode).map(|x| x.result.p50_us).fold(1.0, f64::max) * 1.2;
    line_chart(
        &LineChart {
            title: &format!("p50 latency of {}", mode.title()),
            size: (760, 440),
            x_desc: "Services programmed (log scale)",
            y_desc: "p50 latency (µs)",
            x: SERVICES,
            log_x: true,
            y: 0.0..ymax,
            x_decimals: 0,
            y_decimals: 0,
            legend: Legend::UpperLeft,
        },
        &lines,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mode_gets_a_chart_of_every_path() {
        let charts = charts(&super::super::fixture::report()).unwrap();
        assert_eq!(charts.len(), 6);
        for (name, svg) in charts.iter().filter(|(n, _)| n.starts_with("latency")) {
            assert!(svg.contains("<svg"), "{name}");
            for label in ["tierlb", "iptables", "nftables", "direct (pod IP, the floor)", "10000"] {
                assert!(svg.contains(label), "{name} lacks {label}");
            }
        }
    }
}
