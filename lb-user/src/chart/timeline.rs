//! Small multiples over time (the lab demo's chart): one panel per act side by side, one row per node in
//! each, the same series in every row (each its own colour), spans of time shaded and labelled (a node's roll
//! window), events marked as ticks on the row's floor (a failed request), and each panel's verdict under its
//! title. The time axis is labelled under every panel; the y scale (0 to 100%) is labelled on the first.
use plotters::{
    element::DashedPathElement,
    prelude::*,
    style::text_anchor::{HPos, VPos},
};

use super::{
    Area, ChartError, GREY, HEAD, Rgb, SMALL, Swatch, TEXT, chars_in, document, heading, heading_h, legend,
    legend_h, line_h, px, px_f, text, text_up, text_w, tick_label, ticks, wrap,
};

/// One series every row draws, as a line.
#[derive(Clone, Debug)]
pub struct Series {
    /// Its name in the legend.
    pub name: String,
    /// Its colour: no two series of a chart share one.
    pub colour: Rgb,
    /// Dashed rather than solid (a second cue besides the colour).
    pub dashed: bool,
}

/// A span of time shaded in a row, its label over it.
#[derive(Clone, Debug)]
pub struct Span {
    /// Its start, in the x axis' unit.
    pub from: f64,
    /// Its end.
    pub to: f64,
    /// A word or two (what happens in it).
    pub label: String,
}

/// One row of a [`Panel`].
#[derive(Clone, Debug)]
pub struct Row {
    /// What the row is (a node's name), left of the first panel's row.
    pub label: String,
    /// Each series' points (x, value in 0..=1), in the order of [`Timeline::series`].
    pub lines: Vec<Vec<(f64, f64)>>,
    /// Spans shaded under the lines.
    pub spans: Vec<Span>,
    /// When each event happened (a tick on the row's floor).
    pub marks: Vec<f64>,
}

/// One panel of a [`Timeline`].
#[derive(Clone, Debug)]
pub struct Panel {
    /// Its title.
    pub title: String,
    /// Under the title: what the panel shows (the verdict), wrapped.
    pub note: String,
    /// The x axis runs from 0 to this.
    pub x_max: f64,
    /// Its rows, top to bottom (the same in every panel).
    pub rows: Vec<Row>,
}

/// A chart of [`Panel`]s side by side.
#[derive(Clone, Debug)]
pub struct Timeline {
    /// The chart's title.
    pub title: String,
    /// Under the title, wrapped.
    pub subtitle: String,
    /// The x axis' description, with its unit.
    pub x_desc: String,
    /// The y axis' description, with its unit (the values are drawn as percentages).
    pub y_desc: String,
    /// The series every row draws.
    pub series: Vec<Series>,
    /// The marks' name in the legend and their colour.
    pub marks: (String, Rgb),
    /// The spans' name in the legend.
    pub spans: String,
    /// The panels, left to right.
    pub panels: Vec<Panel>,
}

/// A panel's width, the gap between panels, a row's height and the gap between rows, in pixels.
const PANEL_W: i32 = 330;
const GAP: i32 = 30;
const ROW_H: i32 = 84;
const ROW_GAP: i32 = 22;
/// Between a row's frame and its 0% and 100%, so that a line at either end stays clear of the frame.
const PAD: i32 = 5;
/// How high a mark's tick stands on the row's floor.
const MARK_H: i32 = 12;
/// The shading of a span.
const SHADE: Rgb = Rgb(0xdd, 0xdd, 0xdd);

/// The chart, as an SVG document.
pub fn timeline_chart(t: &Timeline) -> Result<String, ChartError> {
    let rows = t.panels.iter().map(|p| p.rows.len()).max().unwrap_or(0);
    let row_label_w =
        t.panels.iter().flat_map(|p| &p.rows).map(|r| text_w(&r.label, HEAD)).max().unwrap_or(0);
    // The y description turned at the far left, the rows' names, the tick labels, the plots.
    let left = 8 + line_h(TEXT) + 8 + row_label_w + 10 + text_w("100%", TEXT) + 8;
    let width = left + px(t.panels.len()) * (PANEL_W + GAP) - GAP + 16;
    let inner = width - left - 16;
    let mut entries: Vec<(&str, Swatch)> =
        t.series.iter().map(|s| (s.name.as_str(), Swatch::Line(s.colour, s.dashed))).collect();
    entries.push((&t.marks.0, Swatch::Tick(t.marks.1)));
    entries.push((&t.spans, Swatch::Block(SHADE)));
    let heads: Vec<(Vec<String>, Vec<String>)> = t
        .panels
        .iter()
        .map(|p| (wrap(&p.title, chars_in(PANEL_W, HEAD)), wrap(&p.note, chars_in(PANEL_W, TEXT))))
        .collect();
    let head_h =
        heads.iter().map(|(a, b)| px(a.len()) * line_h(HEAD) + px(b.len()) * line_h(TEXT)).max().unwrap_or(0)
            + 8;
    let top = heading_h(&t.title, &t.subtitle, width) + legend_h(&entries, inner) + 12;
    // Room for the first row's span labels.
    let plots_top = top + head_h + line_h(SMALL);
    let plots_h = px(rows) * (ROW_H + ROW_GAP) - ROW_GAP;
    let height = plots_top + plots_h + 6 + 2 * line_h(TEXT) + 12;

    document((width, height), |root| {
        let y = heading(root, &t.title, &t.subtitle, width)?;
        legend(root, &entries, (left, y), inner)?;
        for (i, (p, (title, note))) in (0..).zip(t.panels.iter().zip(&heads)) {
            let x0 = left + i * (PANEL_W + GAP);
            let mut y = top;
            for line in title {
                text(root, line, (x0, y), HEAD, Rgb(0, 0, 0), (HPos::Left, VPos::Top))?;
                y += line_h(HEAD);
            }
            for line in note {
                text(root, line, (x0, y), TEXT, GREY, (HPos::Left, VPos::Top))?;
                y += line_h(TEXT);
            }
            let steps = ticks(p.x_max, 6);
            for (r, row) in (0..).zip(&p.rows) {
                let cell = Cell { x0, y0: plots_top + r * (ROW_H + ROW_GAP), x_max: p.x_max.max(1e-9) };
                cell.draw(root, t, row, &steps)?;
                if i == 0 {
                    let mid = cell.y0 + ROW_H / 2;
                    let name_x = 8 + line_h(TEXT) + 8;
                    text(root, &row.label, (name_x, mid), HEAD, Rgb(0, 0, 0), (HPos::Left, VPos::Center))?;
                    for v in [0.0, 0.5, 1.0] {
                        let label = format!("{:.0}%", v * 100.0);
                        text(
                            root,
                            &label,
                            (x0 - 6, cell.y(v)),
                            TEXT,
                            Rgb(0, 0, 0),
                            (HPos::Right, VPos::Center),
                        )?;
                    }
                }
            }
            let axis_y = plots_top + plots_h + 6;
            let step = steps.get(1).copied().unwrap_or(1.0);
            for s in &steps {
                let x = x0 + px_f(s / p.x_max.max(1e-9) * f64::from(PANEL_W) - 0.5);
                text(
                    root,
                    &tick_label(*s, step),
                    (x, axis_y),
                    TEXT,
                    Rgb(0, 0, 0),
                    (HPos::Center, VPos::Top),
                )?;
            }
            let desc = (x0 + PANEL_W / 2, axis_y + line_h(TEXT));
            text(root, &t.x_desc, desc, TEXT, Rgb(0, 0, 0), (HPos::Center, VPos::Top))?;
        }
        text_up(root, &t.y_desc, (8 + line_h(TEXT) / 2, plots_top + plots_h / 2), TEXT)
    })
}

/// One row of one panel: its top left corner, and the x axis' end.
struct Cell {
    x0: i32,
    y0: i32,
    x_max: f64,
}

impl Cell {
    fn x(&self, t: f64) -> i32 {
        self.x0 + px_f(t.clamp(0.0, self.x_max) / self.x_max * f64::from(PANEL_W) - 0.5)
    }

    fn y(&self, v: f64) -> i32 {
        self.y0 + ROW_H - PAD - px_f(v.clamp(0.0, 1.0) * f64::from(ROW_H - 2 * PAD) - 0.5)
    }

    /// Spans, grid, lines, marks and frame, in that order (later ones on top).
    fn draw(&self, area: &Area<'_>, t: &Timeline, row: &Row, steps: &[f64]) -> Result<(), ChartError> {
        let (x1, y1) = (self.x0 + PANEL_W, self.y0 + ROW_H);
        for s in &row.spans {
            // One pixel short at the end, so that spans end to end (a pod down, then held) stay apart.
            let (a, b) = (self.x(s.from), (self.x(s.to) - 1).max(self.x(s.from) + 1));
            area.draw(&Rectangle::new([(a, self.y0), (b, y1)], RGBColor::from(SHADE).filled()))?;
            // The label over the span, in the gap above the row, where no line runs.
            let at = a.min(x1 - text_w(&s.label, SMALL));
            text(
                area,
                &s.label,
                (at, self.y0 - 2),
                SMALL,
                Rgb(0x33, 0x33, 0x33),
                (HPos::Left, VPos::Bottom),
            )?;
        }
        let grid = RGBColor::from(GREY).mix(0.25).stroke_width(1);
        area.draw(&PathElement::new(vec![(self.x0, self.y(0.5)), (x1, self.y(0.5))], grid))?;
        for s in steps {
            area.draw(&PathElement::new(vec![(self.x(*s), self.y0), (self.x(*s), y1)], grid))?;
        }
        for (series, points) in t.series.iter().zip(&row.lines) {
            let pts: Vec<(i32, i32)> = points.iter().map(|(x, v)| (self.x(*x), self.y(*v))).collect();
            let style = RGBColor::from(series.colour).stroke_width(2);
            if series.dashed {
                area.draw(&DashedPathElement::new(pts, 6, 4, style))?;
            } else {
                area.draw(&PathElement::new(pts, style))?;
            }
        }
        for m in &row.marks {
            let x = self.x(*m);
            area.draw(&PathElement::new(
                vec![(x, y1), (x, y1 - MARK_H)],
                RGBColor::from(t.marks.1).stroke_width(2),
            ))?;
        }
        area.draw(&Rectangle::new([(self.x0, self.y0), (x1, y1)], RGBColor::from(GREY).stroke_width(1)))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chart::okabe_ito;

    fn chart() -> Timeline {
        let row = |n: usize| Row {
            label: format!("node-{n}"),
            lines: vec![vec![(0.0, 1.0), (1.0, 0.0), (2.0, 1.0)], vec![(0.0, 0.0), (2.0, 0.0)]],
            spans: vec![Span { from: 0.8, to: 1.6, label: "rolling".into() }],
            marks: vec![1.0, 1.05],
        };
        Timeline {
            title: "the demo".into(),
            subtitle: "three nodes".into(),
            x_desc: "time since the clients started (s)".into(),
            y_desc: "share of the node's requests (%)".into(),
            series: vec![
                Series { name: "answered".into(), colour: okabe_ito::BLUE, dashed: false },
                Series { name: "by another node".into(), colour: okabe_ito::ORANGE, dashed: true },
            ],
            marks: ("failed request".into(), okabe_ito::VERMILLION),
            spans: "roll window".into(),
            panels: vec![
                Panel {
                    title: "Local".into(),
                    note: "PASS: lost in the window".into(),
                    x_max: 2.0,
                    rows: vec![row(1), row(2)],
                },
                Panel {
                    title: "PreferSameNode".into(),
                    note: "PASS".into(),
                    x_max: 2.0,
                    rows: vec![row(1), row(2)],
                },
            ],
        }
    }

    #[test]
    fn a_timeline_names_its_panels_rows_series_and_axes() {
        let svg = timeline_chart(&chart()).unwrap();
        let texts = crate::chart::texts(&svg);
        for want in [
            "the demo",
            "Local",
            "PreferSameNode",
            "PASS: lost in the window",
            "node-1",
            "node-2",
            "answered",
            "by another node",
            "failed request",
            "roll window",
            "rolling",
            "100%",
            "1.5",
            "time since the clients started (s)",
            "share of the node's requests (%)",
        ] {
            assert!(texts.iter().any(|t| t == want), "no {want:?} in {texts:?}");
        }
        // Each series and the marks in their own colour.
        assert!(svg.contains("#0072B2") && svg.contains("#E69F00") && svg.contains("#D55E00"));
    }
}
