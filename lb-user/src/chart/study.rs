//! The study's chart (`tierlb study --chart`): one panel per phase, one under another, each with the whole
//! phase name over it; in a panel one bar per proxy model, stacked from each endpoint's share of the requests,
//! then the requests that failed and those that hang, with a diamond at the share that crossed nodes. Model
//! labels are wrapped under their bar, never turned, so a long one ("cilium-1.20 (nodeName, then cluster)")
//! stays whole and under its own bar.
use plotters::{
    prelude::*,
    style::text_anchor::{HPos, VPos},
};

use super::{
    Area, ChartError, GREY, HEAD, Rgb, SMALL, Swatch, TEXT, chars_in, diamond, document, heading, heading_h,
    legend, legend_h, line_h, okabe_ito, px, px_f, text, text_up, text_w, wrap,
};
use crate::study::{ModelResult, PhaseResult, StudyResult};

/// A model's column: its bar and the room for its wrapped label.
const SLOT: i32 = 128;
/// A bar's width.
const BAR: i32 = 56;
/// Left of the plots: the y axis' description and tick labels.
const LEFT: i32 = 76;
/// Right of the plots.
const RIGHT: i32 = 24;
/// A plot's height (0 to 100%).
const PLOT_H: i32 = 200;
/// The narrowest canvas, so that the title and legend have room with few models.
const MIN_W: i32 = 680;

/// The endpoints' colours in turn: Okabe and Ito's, orange last as it is the nearest to [`FAILED`]'s
/// vermillion.
const ENDPOINTS: [Rgb; 6] = [
    okabe_ito::BLUE,
    okabe_ito::GREEN,
    okabe_ito::SKY_BLUE,
    okabe_ito::PURPLE,
    okabe_ito::YELLOW,
    okabe_ito::ORANGE,
];
/// Requests that were refused at once.
const FAILED: Rgb = okabe_ito::VERMILLION;
/// Requests that hang until the client's timeout.
const HANG: Rgb = okabe_ito::BLACK;

/// A segment of a model's bar: what it counts and its share.
struct Segment {
    colour: Rgb,
    share: f64,
}

/// The study's chart, as an SVG document.
pub fn study_chart(r: &StudyResult) -> Result<String, ChartError> {
    // Endpoints in order of first appearance, each its colour in every panel.
    let mut endpoints: Vec<&str> = Vec::new();
    for m in r.phases.iter().flat_map(|p| &p.models) {
        for ip in m.shares.keys() {
            if !endpoints.contains(&ip.as_str()) {
                endpoints.push(ip);
            }
        }
    }
    let colour_of =
        |ip: &str| ENDPOINTS[endpoints.iter().position(|e| *e == ip).unwrap_or(0) % ENDPOINTS.len()];
    let names: Vec<String> = endpoints.iter().map(|e| format!("to {e}")).collect();
    let mut entries: Vec<(&str, Swatch)> =
        names.iter().zip(&endpoints).map(|(n, e)| (n.as_str(), Swatch::Block(colour_of(e)))).collect();
    entries.push(("failed (refused at once)", Swatch::Block(FAILED)));
    entries.push(("hang (until the client's timeout)", Swatch::Block(HANG)));
    entries.push(("share that crossed nodes", Swatch::Diamond));

    let models = r.phases.iter().map(|p| p.models.len()).max().unwrap_or(1).max(1);
    let width = (LEFT + px(models) * SLOT + RIGHT).max(MIN_W);
    let inner = width - LEFT - RIGHT;
    // At most 20 characters a line: the width estimate is generous, and a model name full of digits and
    // hyphens (`calico-ebpf-3.31.0-3.31.4`) runs wider than it guesses; the names break after a hyphen.
    let label_chars = chars_in(SLOT - 10, TEXT).min(20);
    let label_lines = r
        .phases
        .iter()
        .flat_map(|p| &p.models)
        .map(|m| px(wrap(&m.label, label_chars).len()))
        .max()
        .unwrap_or(1);
    let title = format!("tierlb study: {}", r.scenario);
    let subtitle = if r.description.is_empty() {
        format!("{:.0} requests/s from all clients", r.requests_per_second)
    } else {
        format!("{} ({:.0} requests/s from all clients)", r.description, r.requests_per_second)
    };
    let heads: Vec<Vec<String>> =
        r.phases.iter().enumerate().map(|(i, p)| wrap(&phase_heading(i, p), chars_in(inner, HEAD))).collect();
    let below = 8 + label_lines * line_h(TEXT) + line_h(TEXT) + 20;
    let top = heading_h(&title, &subtitle, width) + legend_h(&entries, inner) + 10;
    let height = top + heads.iter().map(|h| px(h.len()) * line_h(HEAD) + 6 + PLOT_H + below).sum::<i32>() + 4;

    document((width, height), |root| {
        let y = heading(root, &title, &subtitle, width)?;
        legend(root, &entries, (LEFT, y), inner)?;
        let mut y = top;
        for (p, head) in r.phases.iter().zip(&heads) {
            for line in head {
                text(root, line, (LEFT, y), HEAD, Rgb(0, 0, 0), (HPos::Left, VPos::Top))?;
                y += line_h(HEAD);
            }
            y += 6;
            let plot = Plot { left: LEFT, top: y, width: px(p.models.len()) * SLOT };
            plot.axes(root)?;
            for (j, m) in (0..).zip(&p.models) {
                let centre = LEFT + j * SLOT + SLOT / 2;
                plot.bar(root, centre, &segments(m, &colour_of))?;
                diamond(root, (centre + BAR / 2, plot.y(m.cross_node)), 6)?;
                for (k, line) in (0..).zip(wrap(&m.label, label_chars)) {
                    let at = (centre, y + PLOT_H + 8 + k * line_h(TEXT));
                    text(root, &line, at, TEXT, Rgb(0, 0, 0), (HPos::Center, VPos::Top))?;
                }
            }
            let desc_y = y + PLOT_H + 8 + label_lines * line_h(TEXT) + 2;
            text(
                root,
                "proxy model",
                (LEFT + plot.width / 2, desc_y),
                TEXT,
                GREY,
                (HPos::Center, VPos::Top),
            )?;
            y += PLOT_H + below;
        }
        Ok(())
    })
}

/// A phase's heading: its place and whole name, and its length when it has one.
fn phase_heading(i: usize, p: &PhaseResult) -> String {
    let name = if i == 0 { format!("{} state", p.phase) } else { format!("phase {i}: {}", p.phase) };
    match (p.duration_s, p.requests) {
        (Some(d), Some(n)) => format!("{name} ({d:.0} s, {n:.0} requests)"),
        _ => name,
    }
}

/// A model's bar from the bottom: each endpoint's share, failed, hang.
fn segments(m: &ModelResult, colour_of: &impl Fn(&str) -> Rgb) -> Vec<Segment> {
    let mut s: Vec<Segment> =
        m.shares.iter().map(|(ip, share)| Segment { colour: colour_of(ip), share: *share }).collect();
    s.push(Segment { colour: FAILED, share: m.failed });
    s.push(Segment { colour: HANG, share: m.hang });
    s
}

/// One panel's plot: its left and top edge and width in pixels; 0 to 100% over [`PLOT_H`].
struct Plot {
    left: i32,
    top: i32,
    width: i32,
}

impl Plot {
    /// The pixel row of share `v`.
    fn y(&self, v: f64) -> i32 {
        self.top + PLOT_H - px_f(v.clamp(0.0, 1.0) * f64::from(PLOT_H) - 0.5)
    }

    /// Grid lines and tick labels every 25%, the axis' description, the frame.
    fn axes(&self, area: &Area<'_>) -> Result<(), ChartError> {
        for pct in [0, 25, 50, 75, 100] {
            let y = self.y(f64::from(pct) / 100.0);
            let style =
                if pct == 0 { BLACK.stroke_width(1) } else { RGBColor::from(GREY).mix(0.3).stroke_width(1) };
            area.draw(&PathElement::new(vec![(self.left, y), (self.left + self.width, y)], style))?;
            text(
                area,
                &format!("{pct}%"),
                (self.left - 8, y),
                TEXT,
                Rgb(0, 0, 0),
                (HPos::Right, VPos::Center),
            )?;
        }
        area.draw(&PathElement::new(
            vec![(self.left, self.top), (self.left, self.top + PLOT_H)],
            BLACK.stroke_width(1),
        ))?;
        let tick_w = text_w("100%", TEXT);
        text_up(area, "share of requests (%)", (self.left - 8 - tick_w - 12, self.top + PLOT_H / 2), TEXT)
    }

    /// A stacked bar centred on `centre`, each segment's percentage written in it where it fits.
    fn bar(&self, area: &Area<'_>, centre: i32, segments: &[Segment]) -> Result<(), ChartError> {
        let mut from = 0.0;
        for s in segments.iter().filter(|s| s.share > 0.0) {
            let to = from + s.share;
            let (y0, y1) = (self.y(from), self.y(to));
            area.draw(&Rectangle::new(
                [(centre - BAR / 2, y1), (centre + BAR / 2, y0)],
                RGBColor::from(s.colour).filled(),
            ))?;
            if y0 - y1 >= line_h(SMALL) {
                let ink = if s.colour.light() { Rgb(0, 0, 0) } else { Rgb(255, 255, 255) };
                let label = format!("{:.0}%", s.share * 100.0);
                text(
                    area,
                    &label,
                    (centre, i32::midpoint(y0, y1)),
                    SMALL,
                    ink,
                    (HPos::Center, VPos::Center),
                )?;
            }
            from = to;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::study::{MODELS, PhaseResult, ProxyModel};

    fn model(model: ProxyModel, label: &str, shares: &[(&str, f64)], failed: f64, hang: f64) -> ModelResult {
        ModelResult {
            model,
            label: label.to_owned(),
            shares: shares.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect::<BTreeMap<_, _>>(),
            cross_node: 0.35,
            cross_zone: 0.0,
            failed,
            hang,
            detections: Vec::new(),
        }
    }

    fn result() -> StudyResult {
        let long = "cilium-1.20 (nodeName, then cluster)";
        StudyResult {
            scenario: "tiny".into(),
            description: "two endpoints, one crashes".into(),
            requests_per_second: 100.0,
            health: crate::study::HealthParams::default(),
            phases: vec![
                PhaseResult {
                    phase: "initial".into(),
                    duration_s: None,
                    requests: None,
                    models: vec![
                        model(
                            ProxyModel::KubeProxy,
                            "kube-proxy",
                            &[("10.0.0.1", 0.65), ("10.0.0.2", 0.35)],
                            0.0,
                            0.0,
                        ),
                        model(MODELS[1], long, &[("10.0.0.1", 0.5), ("10.0.0.2", 0.5)], 0.0, 0.0),
                    ],
                },
                PhaseResult {
                    phase: "node-1's pod crashed, EndpointSlice not updated yet".into(),
                    duration_s: Some(30.0),
                    requests: Some(3000.0),
                    models: vec![model(
                        ProxyModel::KubeProxy,
                        "kube-proxy",
                        &[("10.0.0.2", 0.35)],
                        0.4,
                        0.25,
                    )],
                },
            ],
        }
    }

    #[test]
    fn the_study_chart_names_every_phase_model_and_endpoint_whole() {
        let svg = study_chart(&result()).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        let texts = crate::chart::texts(&svg);
        // Wrapped text joined again: a heading broken between words reads back whole.
        let all = texts.join(" ");
        for want in [
            "tierlb study: tiny",
            "two endpoints, one crashes (100 requests/s from all clients)",
            "initial state",
            "phase 1: node-1's pod crashed, EndpointSlice not updated yet (30 s, 3000 requests)",
        ] {
            assert!(all.contains(want), "no {want:?} in {texts:?}");
        }
        for want in [
            "kube-proxy",
            // The long label wrapped between words, each piece under the bar.
            "cilium-1.20",
            "(nodeName, then",
            "cluster)",
            "to 10.0.0.1",
            "to 10.0.0.2",
            "failed (refused at once)",
            "hang (until the client's timeout)",
            "share that crossed nodes",
            "share of requests (%)",
            "proxy model",
            "65%",
            "40%",
            "25%",
        ] {
            assert!(texts.iter().any(|t| t == want), "no {want:?} in {texts:?}");
        }
    }

    #[test]
    fn six_models_with_long_labels_wrap_under_their_own_bars() {
        let mut r = result();
        let labels = [
            "kube-proxy-1.34-1.37",
            "tierlb (passive health, K=3)",
            "cilium-1.18 (zone hints only)",
            "cilium-1.20 (nodeName, then cluster)",
            "calico-ebpf-3.32 (hints, no safeguard)",
            "zone-only",
        ];
        r.phases[0].models = labels
            .iter()
            .map(|l| model(MODELS[0], l, &[("10.0.0.1", 0.65), ("10.0.0.2", 0.35)], 0.0, 0.0))
            .collect();
        let svg = study_chart(&r).unwrap();
        assert!(svg.starts_with(&format!("<svg width=\"{}\"", LEFT + 6 * SLOT + RIGHT)), "{svg}");
        let texts = crate::chart::texts(&svg);
        for piece in
            // The name and its version range apart, the range whole.
            [
                "kube-proxy-",
                "1.34-1.37",
                "cilium-1.20",
                "(nodeName, then",
                "cluster)",
                "calico-ebpf-3.32",
            ]
        {
            assert!(texts.iter().any(|t| t == piece), "no {piece:?} in {texts:?}");
        }
        // Every piece of every label fits its bar's column, by the layout's own (generous) estimate.
        for label in labels {
            for line in wrap(label, chars_in(SLOT - 10, TEXT)) {
                assert!(text_w(&line, TEXT) <= SLOT - 10, "{line:?}");
            }
        }
    }

    #[test]
    fn a_bar_stacks_the_endpoints_then_failed_then_hang() {
        let m = &result().phases[1].models[0];
        let s = segments(m, &|_| ENDPOINTS[0]);
        let shares: Vec<f64> = s.iter().map(|s| s.share).collect();
        assert_eq!(shares, [0.35, 0.4, 0.25]);
        assert_eq!((s[1].colour, s[2].colour), (FAILED, HANG));
    }
}
