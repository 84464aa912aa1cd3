//! The charts `--report` writes under bench/: p50 latency against the number of Services, one per load mode.
use super::{
    figures::{DataPath, Report},
    load::LoadMode,
};

/// The charts `--report` writes: (file name under bench/, SVG).
pub fn charts(r: &Report) -> anyhow::Result<Vec<(String, String)>> {
    LoadMode::ALL.iter().map(|m| Ok((format!("latency-{}.svg", m.as_str()), latency_chart(r, *m)?))).collect()
}

/// A data path's colour in the charts.
fn colour(path: DataPath) -> plotters::style::RGBColor {
    match path {
        DataPath::Direct => plotters::style::RGBColor(60, 60, 60),
        DataPath::Tierlb => plotters::style::RGBColor(31, 119, 180),
        DataPath::Iptables => plotters::style::RGBColor(214, 39, 40),
        DataPath::Nftables => plotters::style::RGBColor(44, 160, 44),
    }
}

/// p50 latency against the number of Services (log scale) for each data path, with direct as the floor.
fn latency_chart(r: &Report, mode: LoadMode) -> anyhow::Result<String> {
    use plotters::prelude::*;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (760, 440)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
        let of = |path: DataPath| -> Vec<(f64, f64)> {
            let mut v: Vec<(f64, f64)> = r
                .rows
                .iter()
                .filter(|x| x.path == path && x.mode == mode && x.services > 0)
                .map(|x| (x.services as f64, x.result.p50_us))
                .collect();
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            v
        };
        let ymax =
            r.rows.iter().filter(|x| x.mode == mode).map(|x| x.result.p50_us).fold(1.0, f64::max) * 1.2;
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("p50 latency of {}", mode.title()), ("sans-serif", 18))
            .margin(14)
            .margin_right(44)
            .x_label_area_size(44)
            .y_label_area_size(60)
            .build_cartesian_2d((1f64..100_000f64).log_scale(), 0f64..ymax)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        chart
            .configure_mesh()
            .x_desc("Services programmed (log scale)")
            .y_desc("p50 latency (us)")
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| format!("{v:.0}"))
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        for path in DataPath::ALL {
            let color = colour(path);
            let pts = if path == DataPath::Direct {
                let Some(d) = r.row(DataPath::Direct, 0, mode) else { continue };
                vec![(1.0, d.result.p50_us), (100_000.0, d.result.p50_us)]
            } else {
                of(path)
            };
            let label = if path == DataPath::Direct {
                "direct (pod IP, the floor)".to_owned()
            } else {
                path.as_str().to_owned()
            };
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
            if path != DataPath::Direct {
                chart
                    .draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mode_gets_a_chart_of_every_path() {
        let charts = charts(&super::super::fixture::report()).unwrap();
        assert_eq!(charts.len(), 2);
        for (name, svg) in &charts {
            assert!(svg.contains("<svg"), "{name}");
            for label in ["tierlb", "iptables", "nftables", "direct (pod IP, the floor)", "10000"] {
                assert!(svg.contains(label), "{name} lacks {label}");
            }
        }
    }
}
