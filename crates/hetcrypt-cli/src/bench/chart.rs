//! The bench's chart, like the seeds' Figure 9: time against file size per policy, both
//! axes logarithmic, drawn as SVG and PNG with an embedded font.

use std::path::Path;
use std::sync::Once;

use anyhow::{anyhow, Context};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use super::stats::BenchReport;

/// DejaVu Sans (Bitstream Vera license, see `assets/DejaVuSans-LICENSE`), embedded so
/// PNG text needs no system font library.
static FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");
/// The family name charts ask for.
const FAMILY: &str = "sans-serif";
/// Chart size in pixels: wide enough for eight sizes and a legend of seven policies.
const SIZE: (u32, u32) = (1100, 700);

/// Line colours, one per policy in order (Okabe-Ito, readable by colour-blind people).
const COLOURS: [RGBColor; 8] = [
    RGBColor(0, 0, 0),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(120, 120, 120),
];

fn register() -> anyhow::Result<()> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        result = register_font(FAMILY, FontStyle::Normal, FONT)
            .map_err(|_| anyhow!("the embedded chart font does not parse"));
    });
    result
}

/// Writes the chart as SVG and PNG.
pub fn write(report: &BenchReport, svg: &Path, png: &Path) -> anyhow::Result<()> {
    register()?;
    draw(SVGBackend::new(svg, SIZE).into_drawing_area(), report)
        .with_context(|| format!("cannot draw {}", svg.display()))?;
    let area = BitMapBackend::new(png, SIZE).into_drawing_area();
    draw(area, report).with_context(|| format!("cannot draw {}", png.display()))?;
    Ok(())
}

/// `8`, `1K`, `16K`: compact tick labels for the size axis.
fn size_label(bytes: f64) -> String {
    let b = bytes.round() as usize;
    if b >= 1024 && b.is_multiple_of(1024) {
        format!("{}K", b / 1024)
    } else {
        b.to_string()
    }
}

/// Every power of two in `lo..=hi`: one tick per doubling of the file size.
fn powers_of_two(lo: f64, hi: f64) -> Vec<f64> {
    (0..63)
        .map(|k| (1u64 << k) as f64)
        .filter(|&x| x >= lo && x <= hi)
        .collect()
}

/// The 1-2-5 ticks of `lo..=hi` (0.1, 0.2, 0.5, 1, 2, 5, ...): enough labels on a log
/// axis that spans less than a decade.
fn one_two_five(lo: f64, hi: f64) -> Vec<f64> {
    let mut ticks = Vec::new();
    let mut decade = 10f64.powi(lo.log10().floor() as i32);
    while decade <= hi {
        for m in [1.0, 2.0, 5.0] {
            let t = m * decade;
            if t >= lo && t <= hi {
                ticks.push(t);
            }
        }
        decade *= 10.0;
    }
    ticks
}

fn draw<DB: DrawingBackend>(
    area: DrawingArea<DB, Shift>,
    report: &BenchReport,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    area.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let points: Vec<(String, Vec<(f64, f64)>)> = report
        .policies
        .iter()
        .map(|p| {
            let pts = report
                .sizes
                .iter()
                .filter_map(|s| {
                    s.policy(p)
                        .map(|r| (s.size.max(1) as f64, r.median_s * 1e3))
                })
                .filter(|(_, ms)| *ms > 0.0)
                .collect();
            (p.clone(), pts)
        })
        .collect();
    let all = points.iter().flat_map(|(_, p)| p.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        // Nothing ran: an empty frame still tells the reader so.
        (x0, x1, y0, y1) = (8.0, 16384.0, 0.1, 10.0);
    }
    // Margins on log axes: a factor, not an offset.
    let (x0, x1) = (x0 / 1.3, x1 * 1.3);
    let (y0, y1) = (y0 / 1.5, y1 * 1.5);

    let title = format!(
        "{} {}: {} files per size, median of {} runs",
        report.cipher,
        report.direction,
        report.sizes.first().map_or(0, |s| s.files),
        report.reps
    );
    let mut chart = ChartBuilder::on(&area)
        .caption(title, (FAMILY, 28))
        .margin(20)
        .x_label_area_size(60)
        .y_label_area_size(90)
        .build_cartesian_2d(
            (x0..x1)
                .log_scale()
                .base(2.0)
                .with_key_points(powers_of_two(x0, x1)),
            (y0..y1).log_scale().with_key_points(one_two_five(y0, y1)),
        )
        .map_err(|e| anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc("file size (bytes, log scale)")
        .y_desc("time (ms, log scale)")
        .x_label_formatter(&|x| size_label(*x))
        .y_label_formatter(&|y| format!("{}", (y * 1e6).round() / 1e6))
        .label_style((FAMILY, 18))
        .axis_desc_style((FAMILY, 20))
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    for (i, (name, pts)) in points.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let style = ShapeStyle::from(&colour).stroke_width(3);
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), style))
            .map_err(|e| anyhow!("{e}"))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
        chart
            .draw_series(
                pts.iter()
                    .map(|&p| Circle::new(p, 5, ShapeStyle::from(&colour).filled())),
            )
            .map_err(|e| anyhow!("{e}"))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FAMILY, 20))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    area.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}
