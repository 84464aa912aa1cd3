//! Charts as SVG, drawn with plotters, one module a kind: [`line_chart`] (the lab benchmark's latency by
//! Service count), [`study_chart`] (`tierlb study --chart`: one panel per phase) and [`timeline_chart`] (the
//! lab demo's small multiples: one panel per act, one row per node). Shared here: the error, the colours, the
//! fonts and how wide their text is, and what every chart draws the same way (its title, its legend).
//!
//! Every chart has a title, axis descriptions with units and tick labels at a size a person reads without
//! zooming; the lab's render test (lb-lab `render`) rasterises each chart the project produces with
//! rsvg-convert and fails if any text lands outside the canvas.
mod line;
mod study;
mod timeline;

use plotters::{
    coord::Shift,
    prelude::*,
    style::text_anchor::{HPos, Pos, VPos},
};

pub use line::{Legend, Line, LineChart, line_chart};
pub use study::study_chart;
pub use timeline::{Panel, Row, Series, Span, Timeline, timeline_chart};

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

impl Rgb {
    /// Whether dark text reads better on this colour than white (relative luminance above about a half).
    fn light(self) -> bool {
        let Rgb(r, g, b) = self;
        0.2126 * f64::from(r) + 0.7152 * f64::from(g) + 0.0722 * f64::from(b) > 140.0
    }
}

/// Okabe and Ito's palette ("Color Universal Design", 2008): eight colours that stay apart for the common
/// colour-vision deficiencies, named as they name them.
pub mod okabe_ito {
    use super::Rgb;
    /// Black.
    pub const BLACK: Rgb = Rgb(0x00, 0x00, 0x00);
    /// Orange.
    pub const ORANGE: Rgb = Rgb(0xe6, 0x9f, 0x00);
    /// Sky blue.
    pub const SKY_BLUE: Rgb = Rgb(0x56, 0xb4, 0xe9);
    /// Bluish green.
    pub const GREEN: Rgb = Rgb(0x00, 0x9e, 0x73);
    /// Yellow.
    pub const YELLOW: Rgb = Rgb(0xf0, 0xe4, 0x42);
    /// Blue.
    pub const BLUE: Rgb = Rgb(0x00, 0x72, 0xb2);
    /// Vermillion.
    pub const VERMILLION: Rgb = Rgb(0xd5, 0x5e, 0x00);
    /// Reddish purple.
    pub const PURPLE: Rgb = Rgb(0xcc, 0x79, 0xa7);
}

/// The colours series take in turn: Okabe and Ito's without black and vermillion, which the charts keep for
/// references and failures.
pub const PALETTE: [Rgb; 6] = [
    okabe_ito::BLUE,
    okabe_ito::ORANGE,
    okabe_ito::GREEN,
    okabe_ito::SKY_BLUE,
    okabe_ito::PURPLE,
    okabe_ito::YELLOW,
];

/// Mesh lines, frames and secondary text.
const GREY: Rgb = Rgb(0x77, 0x77, 0x77);

/// Every chart's font family (the SVG names a generic family; the viewer picks the face).
const FONT: &str = "sans-serif";

/// Font sizes in plotters' unit (its SVG backend writes `font-size` as this over 1.24, so 14 is an 11.3 px
/// font): the chart's title, a panel's heading, ordinary text (ticks, legend, axis descriptions), and
/// annotations inside a plot.
const TITLE: f64 = 22.0;
const HEAD: f64 = 16.0;
const TEXT: f64 = 14.0;
const SMALL: f64 = 13.0;

/// The rendered font size in pixels of plotters' `size`.
fn font_px(size: f64) -> f64 {
    size / 1.24
}

/// A generous width in pixels of `text` in `size`, for layout: 0.62 em a character, above DejaVu Sans' and
/// Liberation Sans' average advance for mixed text (about 0.55 em), so labels get room to spare. Only an
/// estimate: the render test checks what a rasteriser makes of the real fonts.
fn text_w(text: &str, size: f64) -> i32 {
    px_f(text.chars().count() as f64 * font_px(size) * 0.62)
}

/// The characters of `size` that fit in `width` pixels, by [`text_w`]'s estimate (at least one).
fn chars_in(width: i32, size: f64) -> usize {
    let one = font_px(size) * 0.62;
    #[expect(clippy::cast_sign_loss, reason = "at least 1.0")]
    let n = (f64::from(width) / one).floor().max(1.0) as usize;
    n
}

/// A line of text in `size` is this many pixels high, with leading.
fn line_h(size: f64) -> i32 {
    px_f(font_px(size) * 1.35)
}

/// A pixel measure from a float: rounded up, saturating (no chart is 2^31 pixels).
fn px_f(v: f64) -> i32 {
    v.ceil().clamp(0.0, f64::from(i32::MAX)) as i32
}

/// A count (of groups, bars, lines) as a pixel factor; saturates, as no chart has 2^31 of anything.
fn px(count: usize) -> i32 {
    i32::try_from(count).unwrap_or(i32::MAX)
}

/// The drawing area charts draw on: an SVG document in a string.
type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// An SVG document of `size` pixels, white, with what `draw` puts on it.
fn document(
    size: (i32, i32),
    draw: impl FnOnce(&Area<'_>) -> Result<(), ChartError>,
) -> Result<String, ChartError> {
    let mut svg = String::new();
    {
        let size = (size.0.max(1).cast_unsigned(), size.1.max(1).cast_unsigned());
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE)?;
        draw(&root)?;
        root.present()?;
    }
    Ok(svg)
}

/// Text in `size` and `colour`, its `anchor` (horizontal, vertical) at `at`.
fn text(
    area: &Area<'_>,
    s: &str,
    at: (i32, i32),
    size: f64,
    colour: Rgb,
    anchor: (HPos, VPos),
) -> Result<(), ChartError> {
    let colour = RGBColor::from(colour);
    let style = TextStyle::from((FONT, size).into_font()).color(&colour).pos(Pos::new(anchor.0, anchor.1));
    area.draw(&Text::new(s, at, style))?;
    Ok(())
}

/// Text as [`text`], turned a quarter anticlockwise (a y axis' description), centred on `at`.
fn text_up(area: &Area<'_>, s: &str, at: (i32, i32), size: f64) -> Result<(), ChartError> {
    let style = TextStyle::from((FONT, size).into_font().transform(FontTransform::Rotate270))
        .color(&BLACK)
        .pos(Pos::new(HPos::Center, VPos::Center));
    area.draw(&Text::new(s, at, style))?;
    Ok(())
}

/// `text` in lines of at most `width` characters, broken between words; a longer word is broken after a
/// hyphen where it has one (a model name such as `calico-ebpf-3.31.5-3.31.7`), else has a line of its own.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split_whitespace().flat_map(|w| hyphen_pieces(w, width)) {
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

/// `word` cut after hyphens into pieces of at most `width` characters where it can be (a piece without a
/// hyphen to cut at stays whole): first between a name and its version (`kube-proxy-` / `1.34-1.37`, the
/// hyphen before the first digit), so a version range stays whole; else after the last hyphen that fits.
fn hyphen_pieces(word: &str, width: usize) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut rest = word;
    while rest.chars().count() > width {
        let hyphens = || rest.char_indices().filter(|&(i, c)| c == '-' && i < width).map(|(i, _)| i + 1);
        let before_version =
            hyphens().find(|&at| rest[at..].starts_with(|c: char| c.is_ascii_digit()) && at < rest.len());
        let cut = before_version.or_else(|| hyphens().next_back());
        match cut {
            Some(at) if at < rest.len() => {
                pieces.push(&rest[..at]);
                rest = &rest[at..];
            }
            _ => break,
        }
    }
    pieces.push(rest);
    pieces
}

/// How a legend entry shows its series.
#[derive(Clone, Copy, Debug)]
enum Swatch {
    /// A short stroke, as a line is drawn; broken for a dashed one.
    Line(Rgb, bool),
    /// A filled square, as a bar or a shaded span.
    Block(Rgb),
    /// A short upright stroke, as an event marked on a timeline.
    Tick(Rgb),
    /// An outlined diamond, as a value marked on a bar.
    Diamond,
}

/// The swatch's width in pixels; the entry's name starts after it and a gap.
const SWATCH_W: i32 = 22;

/// Draw `swatch` with its left middle at (x, y).
fn swatch(area: &Area<'_>, s: Swatch, (x, y): (i32, i32)) -> Result<(), ChartError> {
    match s {
        Swatch::Line(c, false) => {
            area.draw(&PathElement::new(vec![(x, y), (x + 20, y)], RGBColor::from(c).stroke_width(2)))?;
        }
        Swatch::Line(c, true) => {
            for (a, b) in [(0, 6), (9, 14), (17, 20)] {
                area.draw(&PathElement::new(
                    vec![(x + a, y), (x + b, y)],
                    RGBColor::from(c).stroke_width(2),
                ))?;
            }
        }
        Swatch::Block(c) => {
            area.draw(&Rectangle::new([(x + 3, y - 7), (x + 17, y + 7)], RGBColor::from(c).filled()))?;
        }
        Swatch::Tick(c) => {
            area.draw(&PathElement::new(
                vec![(x + 10, y - 7), (x + 10, y + 7)],
                RGBColor::from(c).stroke_width(2),
            ))?;
        }
        Swatch::Diamond => diamond(area, (x + 10, y), 6)?,
    }
    Ok(())
}

/// A diamond marker, white with a black outline, centred on `c`, `r` pixels from centre to corner.
fn diamond(area: &Area<'_>, (x, y): (i32, i32), r: i32) -> Result<(), ChartError> {
    let corners = vec![(x, y - r), (x + r, y), (x, y + r), (x - r, y)];
    area.draw(&Polygon::new(corners.clone(), WHITE.filled()))?;
    let mut outline = corners;
    outline.push((x, y - r));
    area.draw(&PathElement::new(outline, BLACK.stroke_width(1)))?;
    Ok(())
}

/// Where a legend's entries go in a box `width` pixels wide: entries flow left to right and wrap, each
/// (x offset, line); and how many lines that takes.
fn legend_layout(entries: &[(&str, Swatch)], width: i32) -> (Vec<(i32, i32)>, i32) {
    let (mut x, mut line) = (0, 0);
    let mut at = Vec::new();
    for (name, _) in entries {
        let w = SWATCH_W + 6 + text_w(name, TEXT) + 18;
        if x > 0 && x + w > width {
            (x, line) = (0, line + 1);
        }
        at.push((x, line));
        x += w;
    }
    (at, line + 1)
}

/// The height in pixels of the legend [`legend`] draws for `entries` in `width` pixels.
fn legend_h(entries: &[(&str, Swatch)], width: i32) -> i32 {
    legend_layout(entries, width).1 * line_h(HEAD)
}

/// A legend without a box: swatch and name, flowing left to right from (x, y) and wrapping at `width`.
fn legend(
    area: &Area<'_>,
    entries: &[(&str, Swatch)],
    (x, y): (i32, i32),
    width: i32,
) -> Result<(), ChartError> {
    let (at, _) = legend_layout(entries, width);
    for ((name, s), (dx, line)) in entries.iter().zip(at) {
        let mid = y + line * line_h(HEAD) + line_h(HEAD) / 2;
        swatch(area, *s, (x + dx, mid))?;
        text(area, name, (x + dx + SWATCH_W + 6, mid), TEXT, Rgb(0, 0, 0), (HPos::Left, VPos::Center))?;
    }
    Ok(())
}

/// The chart's title, centred at the top of a `width` pixels wide canvas, and under it `subtitle` wrapped
/// (if any); returns the y below them.
fn heading(area: &Area<'_>, title: &str, subtitle: &str, width: i32) -> Result<i32, ChartError> {
    let mut y = 10;
    for line in wrap(title, chars_in(width - 20, TITLE)) {
        text(area, &line, (width / 2, y), TITLE, Rgb(0, 0, 0), (HPos::Center, VPos::Top))?;
        y += line_h(TITLE);
    }
    for line in wrap(subtitle, chars_in(width - 20, TEXT)) {
        text(area, &line, (width / 2, y), TEXT, GREY, (HPos::Center, VPos::Top))?;
        y += line_h(TEXT);
    }
    Ok(y + 6)
}

/// The height [`heading`] takes for `title` and `subtitle` in a `width` pixels wide canvas.
fn heading_h(title: &str, subtitle: &str, width: i32) -> i32 {
    10 + px(wrap(title, chars_in(width - 20, TITLE)).len()) * line_h(TITLE)
        + px(wrap(subtitle, chars_in(width - 20, TEXT)).len()) * line_h(TEXT)
        + 6
}

/// Tick positions for an axis from 0 to `max`: a round step (1, 2 or 5 times a power of ten) that gives at
/// most `most` intervals.
fn ticks(max: f64, most: usize) -> Vec<f64> {
    if max <= 0.0 || !max.is_finite() {
        return vec![0.0];
    }
    let rough = max / most.max(1) as f64;
    let mag = 10f64.powf(rough.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= rough).unwrap_or(10.0 * mag);
    let n = (max / step + 1e-9).floor() as i32;
    (0..=n).map(|i| f64::from(i) * step).collect()
}

/// A tick value as its label: as many decimals as the step needs.
fn tick_label(v: f64, step: f64) -> String {
    // A step below 1 has a positive negated log; the steps the charts use are far above 1e-300.
    let decimals = if step >= 1.0 { 0 } else { usize::try_from((-step.log10().floor()) as i64).unwrap_or(0) };
    format!("{v:.decimals$}")
}

/// The text of every `<text>` element of `svg`, in document order, unescaped as far as the charts' text
/// needs (plotters escapes the five XML characters).
#[cfg(test)]
pub(crate) fn texts(svg: &str) -> Vec<String> {
    svg.split("<text ")
        .skip(1)
        .filter_map(|t| Some(t.split_once('>')?.1.split_once("</text>")?.0.trim().to_owned()))
        .map(|t| {
            t.replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&quot;", "\"")
                .replace("&apos;", "'")
                .replace("&amp;", "&")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_breaks_between_words_within_the_width() {
        assert_eq!(
            wrap("node-1's pod crashed, EndpointSlice not updated yet", 20),
            ["node-1's pod", "crashed,", "EndpointSlice not", "updated yet"]
        );
        assert_eq!(wrap("initial", 3), ["initial"]);
        assert_eq!(wrap("calico-ebpf-3.31.5-3.31.7", 17), ["calico-ebpf-", "3.31.5-3.31.7"]);
        // Between the name and its version, not inside the version range.
        assert_eq!(wrap("kube-proxy-1.34-1.37", 16), ["kube-proxy-", "1.34-1.37"]);
        assert_eq!(wrap("cilium-1.18.x-1.19", 15), ["cilium-", "1.18.x-1.19"]);
    }

    #[test]
    fn ticks_take_a_round_step_within_the_count() {
        assert_eq!(ticks(9.6, 6), [0.0, 2.0, 4.0, 6.0, 8.0]);
        assert_eq!(ticks(3.0, 6), [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]);
        assert_eq!(ticks(10.0, 5), [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(tick_label(1.5, 0.5), "1.5");
        assert_eq!(tick_label(4.0, 2.0), "4");
    }

    #[test]
    fn a_legend_wraps_to_the_width_it_is_given() {
        let entries = [("success", Swatch::Tick(PALETTE[0])), ("another node", Swatch::Block(PALETTE[1]))];
        assert_eq!(legend_layout(&entries, 1000).1, 1);
        let (at, lines) = legend_layout(&entries, 100);
        assert_eq!((at, lines), (vec![(0, 0), (0, 1)], 2));
    }
}
