//! CSV and SVG line charts for the experiments.

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
pub fn svg(path: &Path, chart: &Chart<'_>) -> Result<(), Box<dyn std::error::Error>> {
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
}
