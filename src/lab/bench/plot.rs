//! CSV and SVG line charts for the experiments.

use super::PlotError;
use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;

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

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(23, 190, 207),
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
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut c = ChartBuilder::on(&root)
        .caption(chart.title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
    c.configure_mesh()
        .x_desc(chart.x_label)
        .y_desc(chart.y_label)
        .draw()?;
    for (i, s) in chart.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        c.draw_series(LineSeries::new(
            s.points.iter().copied(),
            color.stroke_width(2),
        ))?
        .label(s.name.clone())
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
        c.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    c.configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
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
    /// Lines against the left axis.
    pub left: Vec<Series>,
    /// Lines against the right axis (dashed).
    pub right: Vec<Series>,
}

/// Draws `chart` as an SVG file at `path` (both y axes start at zero; the ranges fit the
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
    let y_max = pad(max_of(&chart.left, &|p| p.1));
    let y2_max = pad(max_of(&chart.right, &|p| p.1));
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut c = ChartBuilder::on(&root)
        .caption(chart.title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .right_y_label_area_size(70)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)?
        .set_secondary_coord(0f64..x_max, 0f64..y2_max);
    let x_fmt = |v: &f64| {
        if chart.x_log2 {
            format!("{}", 2f64.powf(*v).round())
        } else {
            format!("{v}")
        }
    };
    c.configure_mesh()
        .x_desc(chart.x_label)
        .y_desc(chart.left_label)
        .x_label_formatter(&x_fmt)
        .draw()?;
    c.configure_secondary_axes()
        .y_desc(chart.right_label)
        .draw()?;
    for (i, s) in chart.left.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<(f64, f64)> = s.points.iter().map(|&(x, y)| (fx(x), y)).collect();
        c.draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
        c.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    for (i, s) in chart.right.iter().enumerate() {
        let color = COLORS[(chart.left.len() + i) % COLORS.len()];
        let pts: Vec<(f64, f64)> = s.points.iter().map(|&(x, y)| (fx(x), y)).collect();
        c.draw_secondary_series(DashedLineSeries::new(
            pts.iter().copied(),
            6,
            4,
            color.stroke_width(2),
        ))?
        .label(s.name.clone())
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
        c.draw_secondary_series(
            pts.iter()
                .map(|&p| TriangleMarker::new(p, 4, color.filled())),
        )?;
    }
    c.configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
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
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut c = ChartBuilder::on(&root)
        .caption(chart.title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
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
    for (i, s) in chart.solid.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts = place(s);
        c.draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
        c.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    for (i, s) in chart.dashed.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts = place(s);
        c.draw_series(DashedLineSeries::new(
            pts.iter().copied(),
            6,
            4,
            color.stroke_width(2),
        ))?
        .label(s.name.clone())
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(1)));
        c.draw_series(
            pts.iter()
                .map(|&p| TriangleMarker::new(p, 4, color.filled())),
        )?;
    }
    c.configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
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
            left: vec![s("latency", 1.0)],
            right: vec![s("rate", 3.0)],
        };
        svg_dual(&dir.join("d.svg"), &chart).unwrap();
        let text = std::fs::read_to_string(dir.join("d.svg")).unwrap();
        assert!(text.starts_with("<svg"));
        assert!(text.contains("latency") && text.contains("rate"));
        assert!(text.contains("\n1024\n"), "ticks are labelled 2^v");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
