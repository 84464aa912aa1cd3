//! Line charts on a linear or logarithmic x axis (the lab benchmark's latency by Service count): lines with
//! optional dots on the measured points, a legend boxed in the plot or in a column beside it.
use std::ops::Range;

use plotters::{
    coord::ranged1d::{Ranged, ValueFormatter},
    prelude::*,
};

use super::{ChartError, FONT, HEAD, Rgb, SWATCH_W, Swatch, TEXT, TITLE, document, legend, text_w};

/// Where a chart's legend goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Legend {
    /// Boxed, inside the plot's upper left corner (few series whose upper left is empty).
    UpperLeft,
    /// In a column right of the plot (many series, or a full plot).
    Right,
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
    /// The x axis' description, with its unit.
    pub x_desc: &'a str,
    /// The y axis' description, with its unit.
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
    let size =
        (i32::try_from(chart.size.0).unwrap_or(i32::MAX), i32::try_from(chart.size.1).unwrap_or(i32::MAX));
    document(size, |root| {
        let plot = match chart.legend {
            Legend::UpperLeft => root.clone(),
            Legend::Right => {
                let legend_w = lines.iter().map(|l| text_w(&l.name, TEXT)).max().unwrap_or(0) + SWATCH_W + 24;
                let (plot, beside) = root.split_horizontally(size.0.saturating_sub(legend_w));
                let entries: Vec<_> =
                    lines.iter().map(|l| (l.name.as_str(), Swatch::Line(l.colour, l.dashed))).collect();
                // One entry a line: the column is only as wide as the longest.
                legend(&beside, &entries, (0, 40), 1)?;
                plot
            }
        };
        let mut builder = ChartBuilder::on(&plot);
        builder
            .caption(chart.title, (FONT, TITLE))
            .margin(14)
            .margin_right(44)
            .x_label_area_size(48)
            .y_label_area_size(64);
        if chart.log_x {
            let ctx = builder.build_cartesian_2d(chart.x.clone().log_scale(), chart.y.clone())?;
            draw_lines(ctx, chart, lines)
        } else {
            let ctx = builder.build_cartesian_2d(chart.x.clone(), chart.y.clone())?;
            draw_lines(ctx, chart, lines)
        }
    })
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
        .label_style((FONT, TEXT))
        .axis_desc_style((FONT, TEXT))
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
        // The legend's stroke as the line is drawn: whole, or in two dashes.
        let gap = if l.dashed { (8, 12) } else { (18, 18) };
        anno.label(l.name.as_str()).legend(move |(x, y)| {
            EmptyElement::at((x, y))
                + PathElement::new(vec![(0, 0), (gap.0, 0)], colour.stroke_width(2))
                + PathElement::new(vec![(gap.1, 0), (20, 0)], colour.stroke_width(2))
        });
        if l.markers {
            ctx.draw_series(l.points.iter().map(|p| Circle::new(*p, 3, colour.filled())))?;
        }
    }
    if chart.legend == Legend::UpperLeft {
        ctx.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font((FONT, HEAD))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chart::PALETTE;

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
