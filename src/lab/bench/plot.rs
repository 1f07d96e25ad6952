//! CSV and SVG line charts for the experiments and the line-rate tests.
//!
//! Every chart draws its legend in a strip below the plot, so that it never covers a curve,
//! with each series' line drawn as it is in the plot (dashed series dashed) and, on charts
//! with two y axes, the axis each series is read against. [`keep_earlier`] moves an earlier
//! run's files aside instead of overwriting them.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::element::{DynElement, IntoDynElement};
use plotters::prelude::*;

use super::PlotError;

/// Width and height of the plot, without the legend strip below it.
const SIZE: (u32, u32) = (800, 500);
/// Height of one row of the legend; two entries share a row.
const LEGEND_ROW: u32 = 20;

/// One legend entry: the series' name, its colour, and whether its line is dashed.
struct Entry {
    name: String,
    color: RGBColor,
    dashed: bool,
}

/// A chart's plot area and its legend strip below.
type Areas<'a> = (
    DrawingArea<SVGBackend<'a>, Shift>,
    DrawingArea<SVGBackend<'a>, Shift>,
);

/// The drawing area of a chart with `entries` legend entries below it: the plot on top,
/// the legend strip drawn underneath.
fn canvas<'a>(path: &'a Path, entries: &[Entry]) -> Result<Areas<'a>, PlotError> {
    let rows = (entries.len() as u32).div_ceil(2);
    let root = SVGBackend::new(path, (SIZE.0, SIZE.1 + rows * LEGEND_ROW + 10)).into_drawing_area();
    root.fill(&WHITE)?;
    Ok(root.split_vertically(SIZE.1))
}

/// Draws the legend in `area`, two entries per row, each with a sample of its line (dashed
/// for a dashed series) and its marker.
fn legend(area: &DrawingArea<SVGBackend<'_>, Shift>, entries: &[Entry]) -> Result<(), PlotError> {
    for (i, e) in entries.iter().enumerate() {
        let x = 70 + (i as i32 % 2) * 370;
        let y = (i as i32 / 2) * LEGEND_ROW as i32 + 10;
        let style = e.color.stroke_width(2);
        if e.dashed {
            for (a, b) in [(0, 7), (11, 18), (22, 28)] {
                area.draw(&PathElement::new([(x + a, y), (x + b, y)], style))?;
            }
            area.draw(&TriangleMarker::new((x + 14, y), 4, e.color.filled()))?;
        } else {
            area.draw(&PathElement::new([(x, y), (x + 28, y)], style))?;
            area.draw(&Circle::new((x + 14, y), 3, e.color.filled()))?;
        }
        area.draw(&Text::new(
            e.name.clone(),
            (x + 36, y - 7),
            ("sans-serif", 14).into_font(),
        ))?;
    }
    Ok(())
}

/// Legend entries for `series`, coloured from the `first`-th colour on, each name followed
/// by `note` (which axis it is read against, on a dual chart).
fn entries<'a>(
    series: &'a [Series],
    first: usize,
    dashed: bool,
    note: &'a str,
) -> impl Iterator<Item = Entry> + 'a {
    series.iter().enumerate().map(move |(i, s)| Entry {
        name: format!("{}{note}", s.name),
        color: COLORS[(first + i) % COLORS.len()],
        dashed,
    })
}

/// A chart on `area` with `title` and the margins every chart has.
fn builder<'a, 'b>(
    area: &'a DrawingArea<SVGBackend<'b>, Shift>,
    title: &str,
) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut b = ChartBuilder::on(area);
    b.caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70);
    b
}

/// The elements that draw `pts` as `e`'s legend shows them: a solid line with circles, or a
/// dashed one with triangles.
fn line<DB: DrawingBackend>(
    pts: &[(f64, f64)],
    e: &Entry,
) -> Vec<DynElement<'static, DB, (f64, f64)>> {
    let (style, fill) = (e.color.stroke_width(2), e.color.filled());
    if e.dashed {
        DashedLineSeries::new(pts.to_vec(), 6, 4, style)
            .into_iter()
            .map(IntoDynElement::into_dyn)
            .chain(
                pts.iter()
                    .map(|&p| TriangleMarker::new(p, 4, fill).into_dyn()),
            )
            .collect()
    } else {
        LineSeries::new(pts.iter().copied(), style)
            .chain(pts.iter().map(|&p| Circle::new(p, 3, fill).into_dyn()))
            .collect()
    }
}

/// Draws the legend below the plot and writes the file.
fn finish(
    top: &DrawingArea<SVGBackend<'_>, Shift>,
    bottom: &DrawingArea<SVGBackend<'_>, Shift>,
    entries: &[Entry],
) -> Result<(), PlotError> {
    legend(bottom, entries)?;
    top.present()?;
    Ok(())
}

/// A tick label without a trailing `.0` (byte counts and other whole numbers read as such).
fn tick(v: &f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// Keeps an earlier run's files from being overwritten: if any of `DIR/<stem><suffix>`
/// for `suffixes` exists, moves each that exists to `DIR/<stem>.<n><suffix>` with the
/// smallest `n` (from 1) free for all of them, and returns where they went, so that the new
/// run writes the usual names and says what it kept.
pub fn keep_earlier(dir: &Path, stem: &str, suffixes: &[&str]) -> std::io::Result<Vec<PathBuf>> {
    let path = |s: &str, x: &str| dir.join(format!("{s}{x}"));
    let taken: Vec<&str> = suffixes
        .iter()
        .copied()
        .filter(|x| path(stem, x).exists())
        .collect();
    if taken.is_empty() {
        return Ok(Vec::new());
    }
    let free = |s: &str| suffixes.iter().all(|x| !path(s, x).exists());
    let Some(kept) = (1u32..).map(|n| format!("{stem}.{n}")).find(|s| free(s)) else {
        return Ok(Vec::new());
    };
    let mut moved = Vec::new();
    for x in taken {
        std::fs::rename(path(stem, x), path(&kept, x))?;
        moved.push(path(&kept, x));
    }
    Ok(moved)
}

/// One line of a chart: its legend and its (x, y) points.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Points, in x order.
    pub points: Vec<(f64, f64)>,
}

/// A chart to draw.
#[derive(Clone, Debug)]
pub struct Chart<'a> {
    /// Title above the plot.
    pub title: &'a str,
    /// X axis label.
    pub x_label: &'a str,
    /// Y axis label.
    pub y_label: &'a str,
    /// The lines.
    pub series: Vec<Series>,
}

/// The series colours, in order (the first six of matplotlib's `tab10`, then the rest).
const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(23, 190, 207),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
];

/// Draws `chart` as an SVG file at `path` (axes start at zero; the ranges fit the data).
pub fn svg(path: &Path, chart: &Chart<'_>) -> Result<(), PlotError> {
    let pts = chart.series.iter().flat_map(|s| s.points.iter());
    let (mut x_max, mut y_max) = (0f64, 0f64);
    for &(x, y) in pts {
        x_max = x_max.max(x);
        y_max = y_max.max(y);
    }
    let x_max = if x_max > 0.0 { x_max * 1.05 } else { 1.0 };
    let y_max = if y_max > 0.0 { y_max * 1.1 } else { 1.0 };
    let entries: Vec<Entry> = entries(&chart.series, 0, false, "").collect();
    let (top, bottom) = canvas(path, &entries)?;
    let mut c = builder(&top, chart.title).build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
    c.configure_mesh()
        .x_desc(chart.x_label)
        .y_desc(chart.y_label)
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .draw()?;
    for (s, e) in chart.series.iter().zip(&entries) {
        c.draw_series(line(&s.points, e))?;
    }
    finish(&top, &bottom, &entries)
}

/// A chart with two y axes over one x axis: `left` series against the left axis, `right`
/// series against the right one (the paper's Figures 15 and 16 plot latency and rate so).
#[derive(Clone, Debug)]
pub struct DualChart<'a> {
    /// Title above the plot.
    pub title: &'a str,
    /// X axis label.
    pub x_label: &'a str,
    /// Left y axis label.
    pub left_label: &'a str,
    /// Right y axis label.
    pub right_label: &'a str,
    /// Space the x axis by powers of two: points are placed at `log2(x)` and the ticks
    /// labelled with `2^v` (for window sizes from 1 to thousands). X values must be >= 1.
    pub x_log2: bool,
    /// Make the left axis logarithmic (base 10): points are placed at `log10(y)` and the
    /// ticks labelled with `10^v` (for latencies that span decades). Left y values must be
    /// positive; smaller ones are drawn at the axis' bottom.
    pub left_log10: bool,
    /// Lines against the left axis (solid; "(left axis)" in the legend).
    pub left: Vec<Series>,
    /// Lines against the right axis (dashed; "(right axis)" in the legend).
    pub right: Vec<Series>,
}

/// Draws `chart` as an SVG file at `path` (both y axes start at zero, or with
/// `left_log10` the left one at the decade below its smallest value; the ranges fit the
/// data).
pub fn svg_dual(path: &Path, chart: &DualChart<'_>) -> Result<(), PlotError> {
    let fx = |x: f64| if chart.x_log2 { x.max(1.0).log2() } else { x };
    let max_of = |series: &[Series], f: &dyn Fn(&(f64, f64)) -> f64| {
        series
            .iter()
            .flat_map(|s| s.points.iter())
            .map(f)
            .fold(0f64, f64::max)
    };
    let all: Vec<Series> = chart.left.iter().chain(&chart.right).cloned().collect();
    let x_max = max_of(&all, &|p| fx(p.0));
    let x_max = if x_max > 0.0 { x_max * 1.05 } else { 1.0 };
    let pad = |m: f64| if m > 0.0 { m * 1.1 } else { 1.0 };
    // The left axis, in log10 of the values when logarithmic.
    let left_min = chart
        .left
        .iter()
        .flat_map(|s| s.points.iter())
        .map(|p| p.1)
        .filter(|&y| y > 0.0)
        .fold(f64::INFINITY, f64::min);
    let (y_lo, y_hi) = if chart.left_log10 {
        let lo = if left_min.is_finite() {
            left_min.log10().floor()
        } else {
            0.0
        };
        let hi = max_of(&chart.left, &|p| p.1).max(f64::MIN_POSITIVE).log10();
        (lo, (hi + 0.1).max(lo + 1.0))
    } else {
        (0.0, pad(max_of(&chart.left, &|p| p.1)))
    };
    let fy = |y: f64| {
        if chart.left_log10 {
            if y > 0.0 {
                y.log10().max(y_lo)
            } else {
                y_lo
            }
        } else {
            y
        }
    };
    let y2_max = pad(max_of(&chart.right, &|p| p.1));
    let entries: Vec<Entry> = entries(&chart.left, 0, false, " (left axis)")
        .chain(entries(
            &chart.right,
            chart.left.len(),
            true,
            " (right axis)",
        ))
        .collect();
    let (top, bottom) = canvas(path, &entries)?;
    let mut c = builder(&top, chart.title)
        .right_y_label_area_size(70)
        .build_cartesian_2d(0f64..x_max, y_lo..y_hi)?
        .set_secondary_coord(0f64..x_max, 0f64..y2_max);
    let x_fmt = |v: &f64| {
        if chart.x_log2 {
            format!("{}", 2f64.powf(*v).round())
        } else {
            tick(v)
        }
    };
    // A log axis is labelled at whole decades only.
    let y_fmt = |v: &f64| {
        if !chart.left_log10 {
            tick(v)
        } else if (v - v.round()).abs() < 1e-9 {
            tick(&10f64.powf(v.round()))
        } else {
            String::new()
        }
    };
    let mut mesh = c.configure_mesh();
    mesh.x_desc(chart.x_label)
        .y_desc(chart.left_label)
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt);
    if chart.left_log10 {
        mesh.y_labels(((y_hi - y_lo).ceil() as usize + 1) * 4);
    }
    mesh.draw()?;
    c.configure_secondary_axes()
        .y_desc(chart.right_label)
        .y_label_formatter(&tick)
        .draw()?;
    for (s, e) in chart.left.iter().zip(&entries) {
        let pts: Vec<(f64, f64)> = s.points.iter().map(|&(x, y)| (fx(x), fy(y))).collect();
        c.draw_series(line(&pts, e))?;
    }
    for (s, e) in chart.right.iter().zip(&entries[chart.left.len()..]) {
        let pts: Vec<(f64, f64)> = s.points.iter().map(|&(x, y)| (fx(x), y)).collect();
        c.draw_secondary_series(line(&pts, e))?;
    }
    finish(&top, &bottom, &entries)
}

/// A chart for quantities that span decades (the FPISA accuracy report's errors): the x axis
/// spaced by powers of two (points at `log2(x)`, ticks labelled `2^v`), the y axis
/// logarithmic (base 10).
#[derive(Clone, Debug)]
pub struct LogChart<'a> {
    /// Title above the plot.
    pub title: &'a str,
    /// X axis label.
    pub x_label: &'a str,
    /// Y axis label.
    pub y_label: &'a str,
    /// Bottom of the y axis; points at or below it (zeros, which a log axis cannot show) are
    /// drawn on it.
    pub y_floor: f64,
    /// Solid lines.
    pub solid: Vec<Series>,
    /// Dashed lines, coloured like the solid line of the same index (e.g. a method's median
    /// solid and its maximum dashed).
    pub dashed: Vec<Series>,
}

/// Draws `chart` as an SVG file at `path`. X values must be >= 1 and `y_floor` > 0.
pub fn svg_log(path: &Path, chart: &LogChart<'_>) -> Result<(), PlotError> {
    if !(chart.y_floor > 0.0 && chart.y_floor.is_finite()) {
        return Err(PlotError(format!(
            "y_floor must be a positive number, not {}",
            chart.y_floor
        )));
    }
    let place = |s: &Series| -> Vec<(f64, f64)> {
        s.points
            .iter()
            .map(|&(x, y)| (x.max(1.0).log2(), y.max(chart.y_floor)))
            .collect()
    };
    let all: Vec<(f64, f64)> = chart
        .solid
        .iter()
        .chain(&chart.dashed)
        .flat_map(place)
        .collect();
    let x_lo = all.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let x_hi = all.iter().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
    let (x_lo, x_hi) = if x_lo.is_finite() && x_hi > x_lo {
        let pad = 0.05 * (x_hi - x_lo);
        (x_lo - pad, x_hi + pad)
    } else {
        (x_lo.min(0.0) - 0.5, x_hi.max(0.0) + 0.5)
    };
    let y_hi = all.iter().map(|p| p.1).fold(chart.y_floor, f64::max) * 10.0;
    // A dashed line takes the colour of the solid line of its index.
    let entries: Vec<Entry> = entries(&chart.solid, 0, false, "")
        .chain(entries(&chart.dashed, 0, true, ""))
        .collect();
    let (top, bottom) = canvas(path, &entries)?;
    let mut c = builder(&top, chart.title)
        .build_cartesian_2d(x_lo..x_hi, (chart.y_floor..y_hi).log_scale())?;
    // Ticks at whole powers of two only.
    let x_fmt = |v: &f64| {
        if (v - v.round()).abs() < 1e-9 {
            format!("{}", 2f64.powf(v.round()))
        } else {
            String::new()
        }
    };
    let y_fmt = |v: &f64| format!("{v:.0e}");
    c.configure_mesh()
        .x_desc(chart.x_label)
        .y_desc(chart.y_label)
        .x_labels((x_hi - x_lo).ceil() as usize + 1)
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .draw()?;
    for (s, e) in chart.solid.iter().chain(&chart.dashed).zip(&entries) {
        c.draw_series(line(&place(s), e))?;
    }
    finish(&top, &bottom, &entries)
}

/// One line of a panel: a series in colour `color` (an index into the palette, so that the
/// same thing has the same colour in every panel), dashed or solid.
#[derive(Clone, Debug)]
pub struct Line {
    /// The series.
    pub series: Series,
    /// Its colour, by index.
    pub color: usize,
    /// Drawn dashed (with triangle markers) instead of solid (with circles).
    pub dashed: bool,
}

/// One chart of a [`Panels`] figure.
#[derive(Clone, Debug)]
pub struct Panel {
    /// Title above the chart (`(a) uniform Bernoulli`).
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// A logarithmic y axis (zeros, which it cannot show, are drawn at its bottom).
    pub y_log: bool,
    /// An x axis spaced by powers of two (FIFO depths 1, 2, 4, ...; x must be positive).
    pub x_log2: bool,
    /// The lines.
    pub lines: Vec<Line>,
}

/// Several charts in a grid over one legend, as a paper's figure with parts (a), (b), (c):
/// the legend lists every distinct (name, colour, dash) of the panels once.
#[derive(Clone, Debug)]
pub struct Panels<'a> {
    /// Title above the grid.
    pub title: &'a str,
    /// Panels per row.
    pub columns: usize,
    /// The charts, row by row.
    pub panels: Vec<Panel>,
}

/// Size of one panel of a [`Panels`] figure.
const PANEL: (u32, u32) = (520, 380);

/// Draws `figure` as an SVG file at `path`.
pub fn svg_panels(path: &Path, figure: &Panels<'_>) -> Result<(), PlotError> {
    if figure.columns == 0 || figure.panels.is_empty() {
        return Err(PlotError("a panel figure needs panels and columns".into()));
    }
    let mut entries: Vec<Entry> = Vec::new();
    for l in figure.panels.iter().flat_map(|p| &p.lines) {
        let color = COLORS[l.color % COLORS.len()];
        if !entries
            .iter()
            .any(|e| e.name == l.series.name && e.color == color && e.dashed == l.dashed)
        {
            entries.push(Entry {
                name: l.series.name.clone(),
                color,
                dashed: l.dashed,
            });
        }
    }
    let columns = figure.columns.min(figure.panels.len());
    let rows = figure.panels.len().div_ceil(columns);
    let (w, h) = (PANEL.0 * columns as u32, PANEL.1 * rows as u32 + 40);
    let legend_rows = (entries.len() as u32).div_ceil(2);
    let root =
        SVGBackend::new(path, (w.max(800), h + legend_rows * LEGEND_ROW + 10)).into_drawing_area();
    root.fill(&WHITE)?;
    let (grid, strip) = root.split_vertically(h);
    let grid = grid.titled(figure.title, ("sans-serif", 18))?;
    let cells = grid.split_evenly((rows, columns));
    for (panel, area) in figure.panels.iter().zip(&cells) {
        draw_panel(area, panel)?;
    }
    legend(&strip, &entries)?;
    root.present()?;
    Ok(())
}

/// Draws one panel of a [`Panels`] figure in `area`.
fn draw_panel(area: &DrawingArea<SVGBackend<'_>, Shift>, p: &Panel) -> Result<(), PlotError> {
    // Where each line's points go: x as log2 on a log2 axis; non-finite points left out.
    let place = |l: &Line| -> Vec<(f64, f64)> {
        l.series
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite() && (!p.x_log2 || *x > 0.0))
            .map(|&(x, y)| (if p.x_log2 { x.log2() } else { x }, y))
            .collect()
    };
    let lines: Vec<Vec<(f64, f64)>> = p.lines.iter().map(place).collect();
    let all = lines.iter().flatten();
    let x_lo = all.clone().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let x_hi = all.clone().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
    let (x_lo, x_hi) = match (x_lo.is_finite(), p.x_log2) {
        (false, _) => (0.0, 1.0),
        (true, true) => (x_lo - 0.2, x_hi.max(x_lo + 1.0) + 0.2),
        (true, false) => (x_lo.min(0.0), if x_hi > 0.0 { x_hi * 1.05 } else { 1.0 }),
    };
    let y_hi = all.clone().map(|p| p.1).fold(0.0, f64::max);
    let x_fmt = |v: &f64| {
        if !p.x_log2 {
            tick(v)
        } else if (v - v.round()).abs() < 1e-9 {
            tick(&2f64.powf(v.round()))
        } else {
            String::new()
        }
    };
    let mut c = ChartBuilder::on(area);
    c.caption(&p.title, ("sans-serif", 15))
        .margin(8)
        .x_label_area_size(35)
        .y_label_area_size(55);
    let entry = |l: &Line| Entry {
        name: String::new(),
        color: COLORS[l.color % COLORS.len()],
        dashed: l.dashed,
    };
    if p.y_log {
        let floor = all
            .map(|p| p.1)
            .filter(|y| *y > 0.0)
            .fold(f64::INFINITY, f64::min);
        let floor = if floor.is_finite() { floor / 2.0 } else { 1e-3 };
        let y_hi = if y_hi > floor {
            y_hi * 2.0
        } else {
            floor * 10.0
        };
        let mut chart = c.build_cartesian_2d(x_lo..x_hi, (floor..y_hi).log_scale())?;
        // Labels at the powers of ten only; no grid lines, which a log axis would crowd.
        let decade = |v: &f64| {
            let e = v.log10();
            if (e - e.round()).abs() < 1e-9 {
                format!("{v:.0e}")
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .disable_mesh()
            .x_desc(&p.x_label)
            .y_desc(&p.y_label)
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&decade)
            .draw()?;
        // The first lines last, on top: where lines coincide, the legend's first entries
        // stay visible. Zeros, which a log axis cannot show, sit at its bottom.
        for (l, pts) in p.lines.iter().zip(&lines).rev() {
            let pts: Vec<(f64, f64)> = pts.iter().map(|&(x, y)| (x, y.max(floor))).collect();
            chart.draw_series(line(&pts, &entry(l)))?;
        }
    } else {
        let y_hi = if y_hi > 0.0 { y_hi * 1.1 } else { 1.0 };
        let mut chart = c.build_cartesian_2d(x_lo..x_hi, 0f64..y_hi)?;
        chart
            .configure_mesh()
            .x_desc(&p.x_label)
            .y_desc(&p.y_label)
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&tick)
            .light_line_style(WHITE)
            .draw()?;
        for (l, pts) in p.lines.iter().zip(&lines).rev() {
            chart.draw_series(line(pts, &entry(l)))?;
        }
    }
    Ok(())
}

/// Writes rows as CSV (values are numbers or plain words, so nothing needs quoting).
pub fn csv(path: &Path, header: &[&str], rows: &[Vec<String>]) -> std::io::Result<()> {
    let mut s = header.join(",");
    s.push('\n');
    for r in rows {
        let _ = writeln!(s, "{}", r.join(","));
    }
    std::fs::write(path, s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_chart_and_a_csv() {
        let dir = std::env::temp_dir().join(format!("pfemu-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let chart = Chart {
            title: "t",
            x_label: "x",
            y_label: "y",
            series: vec![
                Series {
                    name: "a".into(),
                    points: vec![(1.0, 2.0), (2.0, 3.0)],
                },
                Series {
                    name: "b".into(),
                    points: vec![(1.0, 1.0), (2.0, 5.0)],
                },
            ],
        };
        svg(&dir.join("c.svg"), &chart).unwrap();
        let text = std::fs::read_to_string(dir.join("c.svg")).unwrap();
        assert!(text.starts_with("<svg"));
        assert!(text.contains("polyline") || text.contains("path"));
        csv(
            &dir.join("c.csv"),
            &["x", "y"],
            &[vec!["1".into(), "2".into()]],
        )
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join("c.csv")).unwrap(),
            "x,y\n1,2\n"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn writes_a_log_chart_with_zeros_on_the_floor() {
        let dir = std::env::temp_dir().join(format!("pfemu-plot3-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let s = |name: &str, k: f64| Series {
            name: name.into(),
            points: [2.0, 8.0, 64.0].iter().map(|&x| (x, k * x)).collect(),
        };
        let mut chart = LogChart {
            title: "t",
            x_label: "workers",
            y_label: "error",
            y_floor: 1e-12,
            solid: vec![s("median", 1e-9), s("zero", 0.0)],
            dashed: vec![s("max", 1e-7)],
        };
        svg_log(&dir.join("l.svg"), &chart).unwrap();
        let text = std::fs::read_to_string(dir.join("l.svg")).unwrap();
        assert!(text.starts_with("<svg"));
        assert!(text.contains("median") && text.contains("max"));
        assert!(text.contains("\n64\n"), "x ticks are labelled 2^v");
        chart.y_floor = 0.0;
        assert!(svg_log(&dir.join("bad.svg"), &chart).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn writes_a_two_axis_chart_with_a_log2_x_axis() {
        let dir = std::env::temp_dir().join(format!("pfemu-plot2-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let s = |name: &str, k: f64| Series {
            name: name.into(),
            points: [1.0, 4.0, 16.0, 1024.0]
                .iter()
                .map(|&x| (x, k * x))
                .collect(),
        };
        let chart = DualChart {
            title: "t",
            x_label: "window",
            left_label: "latency",
            right_label: "rate",
            x_log2: true,
            left_log10: false,
            left: vec![s("latency", 1.0)],
            right: vec![s("rate", 3.0)],
        };
        svg_dual(&dir.join("d.svg"), &chart).unwrap();
        let text = std::fs::read_to_string(dir.join("d.svg")).unwrap();
        assert!(text.starts_with("<svg"));
        assert!(text.contains("latency") && text.contains("rate"));
        assert!(text.contains("\n1024\n"), "ticks are labelled 2^v");
        assert!(
            text.contains("latency (left axis)") && text.contains("rate (right axis)"),
            "the legend names each series' axis"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_earlier_runs_files_are_moved_aside_not_overwritten() {
        let dir = std::env::temp_dir().join(format!("pfemu-plot4-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let sfx = [".csv", ".svg"];
        assert!(keep_earlier(&dir, "fig", &sfx).unwrap().is_empty());
        std::fs::write(dir.join("fig.csv"), "first").unwrap();
        std::fs::write(dir.join("fig.svg"), "first").unwrap();
        let kept = keep_earlier(&dir, "fig", &sfx).unwrap();
        assert_eq!(kept, vec![dir.join("fig.1.csv"), dir.join("fig.1.svg")]);
        assert!(!dir.join("fig.csv").exists());
        std::fs::write(dir.join("fig.csv"), "second").unwrap();
        let kept = keep_earlier(&dir, "fig", &sfx).unwrap();
        assert_eq!(kept, vec![dir.join("fig.2.csv")]);
        assert_eq!(
            std::fs::read_to_string(dir.join("fig.1.csv")).unwrap(),
            "first"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("fig.2.csv")).unwrap(),
            "second"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn whole_ticks_have_no_decimals() {
        assert_eq!(tick(&1500.0), "1500");
        assert_eq!(tick(&0.5), "0.5");
        assert_eq!(tick(&0.125), "0.125");
    }
}
