//! Charts as SVG, drawn with plotters: grouped bars (the study, `tierlb study --chart`) and line charts (the
//! lab's demo timeline and its benchmark's latency by Service count). Every chart has the same frame: a
//! caption, axis descriptions, a mesh, and a legend inside the plot or beside it.
use std::ops::Range;

use plotters::{
    coord::{
        Shift,
        ranged1d::{Ranged, ValueFormatter},
    },
    prelude::*,
    style::text_anchor::{HPos, Pos, VPos},
};

use crate::study::StudyResult;

/// Drawing a chart failed.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    /// plotters could not draw an element (with the SVG backend: only a text layout can fail).
    #[error("drawing the chart")]
    Draw {
        /// What plotters reported.
        #[from]
        source: DrawingAreaErrorKind<std::io::Error>,
    },
}

/// An sRGB colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rgb(pub u8, pub u8, pub u8);

impl From<Rgb> for RGBColor {
    fn from(Rgb(r, g, b): Rgb) -> Self {
        RGBColor(r, g, b)
    }
}

/// The colours series take in turn.
pub const PALETTE: [Rgb; 8] = [
    Rgb(0x4e, 0x79, 0xa7),
    Rgb(0xf2, 0x8e, 0x2b),
    Rgb(0xe1, 0x57, 0x59),
    Rgb(0x76, 0xb7, 0xb2),
    Rgb(0x59, 0xa1, 0x4f),
    Rgb(0xed, 0xc9, 0x48),
    Rgb(0xb0, 0x7a, 0xa1),
    Rgb(0x9c, 0x75, 0x5f),
];

/// The bar chart's colour for requests that reached no endpoint.
const FAILED: Rgb = Rgb(0x99, 0x99, 0x99);

/// The bar chart's name for requests that reached no endpoint.
const FAILED_NAME: &str = "failed/hang";

/// Every chart's font family (the SVG names a generic family; the viewer picks the face).
const FONT: &str = "sans-serif";

/// Where a chart's legend goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Legend {
    /// Boxed, inside the plot's upper left corner (few series whose upper left is empty).
    UpperLeft,
    /// In a column right of the plot (many series, or a full plot).
    Right,
}

/// Width of a legend column for entries named `names`: swatch, gap, the longest name, margin.
fn legend_width<'a>(names: impl IntoIterator<Item = &'a str>) -> u32 {
    let longest = names.into_iter().map(|n| n.chars().count()).max().unwrap_or(0);
    24 + (longest as u32) * CHAR_PX as u32 + 20
}

/// One line of a [`LineChart`].
#[derive(Clone, Debug)]
pub struct Line {
    /// Its name in the legend.
    pub name: String,
    /// Its points, in x order.
    pub points: Vec<(f64, f64)>,
    /// Its colour.
    pub colour: Rgb,
    /// Dashed rather than solid.
    pub dashed: bool,
    /// A dot on each point: measurements, not a continuous series or a reference level.
    pub markers: bool,
}

/// A line chart's frame.
#[derive(Clone, Debug)]
pub struct LineChart<'a> {
    /// The caption.
    pub title: &'a str,
    /// Width and height in pixels.
    pub size: (u32, u32),
    /// The x axis' description.
    pub x_desc: &'a str,
    /// The y axis' description.
    pub y_desc: &'a str,
    /// The x axis' range.
    pub x: Range<f64>,
    /// A logarithmic x axis (the range must then be positive).
    pub log_x: bool,
    /// The y axis' range.
    pub y: Range<f64>,
    /// Decimals of the x axis' tick labels.
    pub x_decimals: usize,
    /// Decimals of the y axis' tick labels.
    pub y_decimals: usize,
    /// Where the legend goes.
    pub legend: Legend,
}

/// `lines` in `chart`'s frame, as an SVG document.
pub fn line_chart(chart: &LineChart, lines: &[Line]) -> Result<String, ChartError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, chart.size).into_drawing_area();
        root.fill(&WHITE)?;
        let plot = match chart.legend {
            Legend::UpperLeft => root.clone(),
            Legend::Right => {
                let legend_w = legend_width(lines.iter().map(|l| l.name.as_str()));
                let (plot, side) = root.split_horizontally(chart.size.0.saturating_sub(legend_w));
                let entries: Vec<_> = lines
                    .iter()
                    .map(|l| (l.name.as_str(), l.colour, Swatch::Line { dashed: l.dashed }))
                    .collect();
                side_legend(&side, &entries)?;
                plot
            }
        };
        let mut builder = frame(&plot, chart.title);
        if chart.log_x {
            let ctx = builder.build_cartesian_2d(chart.x.clone().log_scale(), chart.y.clone())?;
            draw_lines(ctx, chart, lines)?;
        } else {
            let ctx = builder.build_cartesian_2d(chart.x.clone(), chart.y.clone())?;
            draw_lines(ctx, chart, lines)?;
        }
        root.present()?;
    }
    Ok(svg)
}

/// The frame every chart shares: caption, margins, room for the axes' labels.
fn frame<'a, 'b>(
    area: &'a DrawingArea<SVGBackend<'b>, Shift>,
    title: &str,
) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut b = ChartBuilder::on(area);
    b.caption(title, (FONT, 18)).margin(14).margin_right(44).x_label_area_size(44).y_label_area_size(60);
    b
}

/// The mesh, the lines and (for [`Legend::UpperLeft`]) the boxed legend, in a built chart.
fn draw_lines<'a, X>(
    mut ctx: ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, plotters::coord::types::RangedCoordf64>>,
    chart: &LineChart,
    lines: &[Line],
) -> Result<(), ChartError>
where
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let (xd, yd) = (chart.x_decimals, chart.y_decimals);
    ctx.configure_mesh()
        .x_desc(chart.x_desc)
        .y_desc(chart.y_desc)
        .x_label_formatter(&|v| format!("{v:.xd$}"))
        .y_label_formatter(&|v| format!("{v:.yd$}"))
        .draw()?;
    for l in lines {
        let colour = RGBColor::from(l.colour);
        let style = colour.stroke_width(2);
        let anno = if l.dashed {
            ctx.draw_series(DashedLineSeries::new(l.points.iter().copied(), 6, 4, style))?
        } else {
            ctx.draw_series(LineSeries::new(l.points.iter().copied(), style))?
        };
        anno.label(l.name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2)));
        if l.markers {
            ctx.draw_series(l.points.iter().map(|p| Circle::new(*p, 3, colour.filled())))?;
        }
    }
    if chart.legend == Legend::UpperLeft {
        ctx.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
    }
    Ok(())
}

/// How a legend entry shows its series.
#[derive(Clone, Copy)]
enum Swatch {
    /// A short stroke, as the series is drawn.
    Line {
        /// Broken in two, for a dashed series.
        dashed: bool,
    },
    /// A filled square, for bars.
    Block,
}

/// A legend in its own column: one swatch and name a line, from the top.
fn side_legend(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    entries: &[(&str, Rgb, Swatch)],
) -> Result<(), ChartError> {
    for (i, (name, colour, swatch)) in (0..).zip(entries) {
        let colour = RGBColor::from(*colour);
        let y = 50 + 18 * i;
        match swatch {
            Swatch::Block => area.draw(&Rectangle::new([(4, y - 5), (14, y + 5)], colour.filled()))?,
            Swatch::Line { dashed: false } => {
                area.draw(&PathElement::new(vec![(0, y), (18, y)], colour.stroke_width(2)))?;
            }
            Swatch::Line { dashed: true } => {
                area.draw(&PathElement::new(vec![(0, y), (6, y)], colour.stroke_width(2)))?;
                area.draw(&PathElement::new(vec![(10, y), (16, y)], colour.stroke_width(2)))?;
            }
        }
        area.draw(&Text::new(*name, (24, y - 6), (FONT, 12)))?;
    }
    Ok(())
}

/// The study's chart: one group of bars per (phase, model), one bar per endpoint's share of the requests,
/// and one for the requests that failed or hung.
pub fn study_chart(r: &StudyResult) -> Result<String, ChartError> {
    let groups: Vec<BarGroup> = r
        .phases
        .iter()
        .flat_map(|p| {
            p.models.iter().map(move |m| {
                let mut bars: Vec<Bar> =
                    m.shares.iter().map(|(k, v)| Bar { series: k.clone(), value: *v }).collect();
                bars.push(Bar { series: FAILED_NAME.into(), value: m.failed + m.hang });
                BarGroup { label: m.label.clone(), section: p.phase.clone(), bars }
            })
        })
        .collect();
    bar_chart(&format!("tierlb study: {}", r.scenario), &groups, "share of requests")
}

/// One group of a [`bar_chart`].
#[derive(Clone, Debug)]
pub struct BarGroup {
    /// Under the group, turned (the study's model).
    pub label: String,
    /// Under the run of consecutive groups that share it (the study's phase).
    pub section: String,
    /// The group's bars, left to right.
    pub bars: Vec<Bar>,
}

/// One bar of a [`BarGroup`].
#[derive(Clone, Debug)]
pub struct Bar {
    /// The series it belongs to: its colour and legend entry.
    pub series: String,
    /// Its height, a share in 0..=1.
    pub value: f64,
}

/// About how wide a character of the 12-point label font is, in pixels.
const CHAR_PX: i32 = 6;

/// A count (of groups, bars, characters) as a pixel coordinate factor; saturates, as no chart has 2^31 of
/// anything.
fn px(count: usize) -> i32 {
    i32::try_from(count).unwrap_or(i32::MAX)
}

/// A grouped bar chart of shares (0..=1, shown as percentages), with each group's label turned under it and
/// each section's name under its groups. A series keeps its colour in every group; "failed/hang" is grey.
pub fn bar_chart(title: &str, groups: &[BarGroup], y_desc: &str) -> Result<String, ChartError> {
    // The series in order of first appearance, for the colours and the legend.
    let mut series: Vec<&str> = Vec::new();
    for b in groups.iter().flat_map(|g| &g.bars) {
        if !series.contains(&b.series.as_str()) {
            series.push(&b.series);
        }
    }
    let colour_of = |name: &str| {
        if name == FAILED_NAME {
            FAILED
        } else {
            PALETTE[series.iter().position(|s| *s == name).unwrap_or(0) % PALETTE.len()]
        }
    };
    // x is in pixels of the plot: a group is its bars (14 px each) between two halves of an 18 px gap.
    let (bar, gap) = (14, 18);
    let bars_per = px(groups.iter().map(|g| g.bars.len()).max().unwrap_or(1).max(1));
    let group = bars_per * bar + gap;
    let n = px(groups.len().max(1));
    // Below the axis: the turned labels, then up to three lines of section name.
    let label_px = groups.iter().map(|g| px(g.label.chars().count())).max().unwrap_or(0) * CHAR_PX;
    let below = 12 + label_px + 12 + 3 * 14;
    let legend_w = legend_width(series.iter().copied());
    // Both are positive: `below` is a sum of positive terms and the width is at least 360.
    let size = ((60 + 14 + 44 + group * n).max(360).cast_unsigned() + legend_w, 300 + below.cast_unsigned());

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE)?;
        let (plot, legend_area) = root.split_horizontally(size.0 - legend_w);
        let entries: Vec<_> = series.iter().map(|s| (*s, colour_of(s), Swatch::Block)).collect();
        side_legend(&legend_area, &entries)?;
        let group_centres: Vec<i32> = (0..n).map(|g| g * group + group / 2).collect();
        let mut ctx = frame(&plot, title)
            .x_label_area_size(below.cast_unsigned())
            .build_cartesian_2d((0..group * n).with_key_points(group_centres), 0.0..1.0)?;
        // The labels are drawn below, by hand: plotters centres a turned tick label on its tick, which puts
        // a long one across the plot.
        ctx.configure_mesh()
            .disable_x_mesh()
            .light_line_style(TRANSPARENT)
            .y_desc(y_desc)
            .y_label_formatter(&|v: &f64| format!("{:.0}%", v * 100.0))
            .x_label_formatter(&|_: &i32| String::new())
            .draw()?;
        for (g, grp) in (0..).zip(groups) {
            let x0 = g * group + gap / 2;
            ctx.draw_series((0..).zip(&grp.bars).map(|(i, b)| {
                let x = x0 + bar * i;
                Rectangle::new(
                    [(x, 0.0), (x + bar, b.value.clamp(0.0, 1.0))],
                    RGBColor::from(colour_of(&b.series)).filled(),
                )
            }))?;
        }
        let at = |x: i32| ctx.backend_coord(&(x, 0.0));
        let turned = TextStyle::from((FONT, 12).into_font().transform(FontTransform::Rotate90))
            .pos(Pos::new(HPos::Left, VPos::Center));
        for (g, grp) in (0..).zip(groups) {
            let (x, y) = at(g * group + group / 2);
            root.draw(&Text::new(grp.label.as_str(), (x, y + 10), turned.clone()))?;
        }
        // Each run of groups with the same section: its name under them, between separators.
        let mut start = 0;
        while start < groups.len() {
            let end = (start..groups.len())
                .find(|&i| groups[i].section != groups[start].section)
                .unwrap_or(groups.len());
            let ((x0, y), (x1, _)) = (at(px(start) * group), at(px(end) * group));
            let top = y + 12 + label_px + 6;
            for x in [x0, x1] {
                root.draw(&PathElement::new(
                    vec![(x, y), (x, top + 3 * 14)],
                    BLACK.mix(0.3).stroke_width(1),
                ))?;
            }
            let centred = TextStyle::from((FONT, 12).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
            let width = usize::try_from(((x1 - x0 - 8) / CHAR_PX).max(8)).unwrap_or(8);
            for (i, line) in (0..).zip(wrap(&groups[start].section, width).iter().take(3)) {
                root.draw(&Text::new(line.as_str(), (i32::midpoint(x0, x1), top + 14 * i), centred.clone()))?;
            }
            start = end;
        }
        root.present()?;
    }
    Ok(svg)
}

/// `text` in lines of at most `width` characters, broken between words (a longer word has a line of its
/// own).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        match lines.last_mut() {
            Some(l) if l.chars().count() + 1 + word.chars().count() <= width => {
                l.push(' ');
                l.push_str(word);
            }
            _ => lines.push(word.to_owned()),
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::study::{ModelResult, PhaseResult, ProxyModel};

    fn model(model: ProxyModel, shares: &[(&str, f64)], failed: f64) -> ModelResult {
        ModelResult {
            model,
            label: model.name().to_owned(),
            shares: shares.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect::<BTreeMap<_, _>>(),
            cross_node: 0.0,
            cross_zone: 0.0,
            failed,
            hang: 0.0,
            detections: Vec::new(),
        }
    }

    #[test]
    fn the_study_chart_names_every_phase_model_and_endpoint() {
        let r = StudyResult {
            scenario: "tiny".into(),
            description: String::new(),
            requests_per_second: 100.0,
            health: crate::study::HealthParams::default(),
            phases: vec![
                PhaseResult {
                    phase: "steady".into(),
                    duration_s: None,
                    requests: None,
                    models: vec![
                        model(ProxyModel::KubeProxy, &[("10.0.0.1", 0.65), ("10.0.0.2", 0.35)], 0.0),
                        model(ProxyModel::Tierlb, &[("10.0.0.1", 0.5), ("10.0.0.2", 0.5)], 0.0),
                    ],
                },
                PhaseResult {
                    phase: "crash".into(),
                    duration_s: None,
                    requests: None,
                    models: vec![model(ProxyModel::KubeProxy, &[("10.0.0.2", 0.35)], 0.65)],
                },
            ],
        };
        let svg = study_chart(&r).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        for want in [
            "tierlb study: tiny",
            "steady",
            "crash",
            "kube-proxy",
            "tierlb",
            "10.0.0.1",
            "10.0.0.2",
            "failed/hang",
        ] {
            assert!(svg.contains(want), "no {want:?} in {svg}");
        }
    }

    #[test]
    fn wrap_breaks_between_words_within_the_width() {
        assert_eq!(
            wrap("node-1's pod crashed, EndpointSlice not updated yet", 20),
            ["node-1's pod", "crashed,", "EndpointSlice not", "updated yet"]
        );
        assert_eq!(wrap("initial", 3), ["initial"]);
    }

    #[test]
    fn a_line_chart_labels_its_series_and_axes() {
        let lines = [
            Line {
                name: "a success".into(),
                points: vec![(0.0, 1.0), (1.0, 0.5)],
                colour: PALETTE[0],
                dashed: false,
                markers: true,
            },
            Line {
                name: "a off-node".into(),
                points: vec![(0.0, 0.0), (1.0, 0.5)],
                colour: PALETTE[1],
                dashed: true,
                markers: false,
            },
        ];
        for (log_x, legend) in [(false, Legend::Right), (true, Legend::UpperLeft)] {
            let chart = LineChart {
                title: "over time",
                size: (700, 400),
                x_desc: "seconds",
                y_desc: "fraction",
                x: if log_x { 0.5..2.0 } else { 0.0..1.0 },
                log_x,
                y: 0.0..1.0,
                x_decimals: 1,
                y_decimals: 2,
                legend,
            };
            let svg = line_chart(&chart, &lines).unwrap();
            for want in ["<svg", "over time", "seconds", "fraction", "a success", "a off-node"] {
                assert!(svg.contains(want), "{legend:?}: no {want:?} in {svg}");
            }
        }
    }
}
