//! `cargo xtask soak --plot FILE`: the soak run as an SVG chart — RSS, open upstream
//! connections and p99 latency against mounts completed — with the Go provider's figures
//! from the measuring rig as a second series.

use std::path::Path;

use anyhow::{Context, bail};
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

/// One checkpoint of a run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Sample {
    pub(crate) mounts: f64,
    pub(crate) rss_mib: f64,
    pub(crate) connections: f64,
    /// None at checkpoints without mounts (the start).
    pub(crate) p99_ms: Option<f64>,
}

/// A named run.
#[derive(Debug)]
pub(crate) struct Series {
    pub(crate) label: String,
    pub(crate) samples: Vec<Sample>,
}

/// The Go provider's figures: a CSV of `mounts,rss_kib,tcp_established,p99_ms` (lines
/// starting with `#` are comments; `-` for no latency), or the rig's own JSON record.
pub(crate) fn read_baseline(path: &Path) -> anyhow::Result<Vec<Sample>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the baseline {}", path.display()))?;
    if path.extension().is_some_and(|e| e == "json") {
        let record: serde_json::Value = serde_json::from_str(&text)?;
        let samples = record["samples"]
            .as_array()
            .context("the rig record has no samples")?;
        return Ok(samples
            .iter()
            .filter(|s| s["phase"] != "idle")
            .filter_map(|s| {
                Some(Sample {
                    mounts: s["mounts_done"].as_f64()?,
                    rss_mib: s["rss_kib"].as_f64()? / 1024.0,
                    connections: s["tcp_established"].as_f64()?,
                    p99_ms: s["lat_ms_p99"].as_f64(),
                })
            })
            .collect());
    }
    let mut samples = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with("mounts") {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let [mounts, rss, conns, p99] = fields.as_slice() else {
            bail!("{}:{}: expected 4 fields", path.display(), n + 1);
        };
        let number = |s: &str| -> anyhow::Result<f64> {
            s.parse()
                .with_context(|| format!("{}:{}: {s:?} is not a number", path.display(), n + 1))
        };
        samples.push(Sample {
            mounts: number(mounts)?,
            rss_mib: number(rss)? / 1024.0,
            connections: number(conns)?,
            p99_ms: if *p99 == "-" {
                None
            } else {
                Some(number(p99)?)
            },
        });
    }
    Ok(samples)
}

/// Draws the three panels into an SVG document.
pub(crate) fn svg(title: &str, series: &[Series]) -> anyhow::Result<String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (900, 960)).into_drawing_area();
        root.fill(&WHITE).map_err(draw)?;
        let (head, body) = root.split_vertically(40);
        head.titled(title, ("sans-serif", 22)).map_err(draw)?;
        let panels = body.split_evenly((3, 1));
        let all = || series.iter().flat_map(|s| s.samples.iter());
        let x_max = all().map(|s| s.mounts).fold(1.0, f64::max) * 1.02;

        // RSS, linear: a leak is a slope.
        let rss_max = all().map(|s| s.rss_mib).fold(1.0, f64::max) * 1.1;
        let panel = |i: usize| &panels[i];
        draw_panel(
            panel(0),
            "resident memory (MiB)",
            "MiB",
            (x_max, 0.0..rss_max),
            series,
            |p| Some(p.rss_mib),
        )?;
        // Open upstream connections, log: 3 against thousands.
        let conn_max = all().map(|s| s.connections).fold(10.0, f64::max) * 2.0;
        draw_panel(
            panel(1),
            "open upstream connections (log)",
            "connections",
            (x_max, (0.5..conn_max).log_scale()),
            series,
            |p| Some(p.connections.max(0.5)),
        )?;
        // p99 mount latency, log.
        let p99 = || all().filter_map(|s| s.p99_ms);
        let (lo, hi) = (
            p99().fold(f64::INFINITY, f64::min).min(1.0) / 2.0,
            p99().fold(1.0, f64::max) * 2.0,
        );
        draw_panel(
            panel(2),
            "p99 mount latency per checkpoint (ms, log)",
            "ms",
            (x_max, (lo..hi).log_scale()),
            series,
            |p| p.p99_ms,
        )?;
        root.present().map_err(draw)?;
    }
    Ok(out)
}

const COLORS: [RGBColor; 2] = [RGBColor(0x1f, 0x77, 0xb4), RGBColor(0xd6, 0x27, 0x28)];

/// One panel: the series' values against mounts completed, with a legend.
fn draw_panel<Y>(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    y_desc: &str,
    (x_max, y): (f64, Y),
    series: &[Series],
    value: impl Fn(&Sample) -> Option<f64> + Copy,
) -> anyhow::Result<()>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..x_max, y)
        .map_err(draw)?;
    chart
        .configure_mesh()
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .x_desc("mounts completed")
        .y_desc(y_desc)
        .draw()
        .map_err(draw)?;
    for (s, color) in series.iter().zip(COLORS) {
        line(&mut chart, s, color, value)?;
    }
    legend(&mut chart)
}

type Chart<'a, 'b, Y> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<plotters::coord::types::RangedCoordf64, Y>>;

fn line<Y>(
    chart: &mut Chart<'_, '_, Y>,
    series: &Series,
    color: RGBColor,
    y: impl Fn(&Sample) -> Option<f64>,
) -> anyhow::Result<()>
where
    Y: Ranged<ValueType = f64>,
{
    let points: Vec<(f64, f64)> = series
        .samples
        .iter()
        .filter_map(|s| Some((s.mounts, y(s)?)))
        .collect();
    chart
        .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
        .map_err(draw)?
        .label(series.label.clone())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    chart
        .draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 3, color.filled())),
        )
        .map_err(draw)?;
    Ok(())
}

fn legend<'a, 'b: 'a, Y>(chart: &mut Chart<'a, 'b, Y>) -> anyhow::Result<()>
where
    Y: Ranged<ValueType = f64>,
{
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(draw)
}

fn draw<E: std::fmt::Debug>(err: E) -> anyhow::Error {
    anyhow::anyhow!("drawing the chart: {err:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_series_are_drawn_with_their_labels() {
        let ours = Series {
            label: "this provider".into(),
            samples: (0..=10)
                .map(|i| Sample {
                    mounts: f64::from(i) * 2000.0,
                    rss_mib: 16.6,
                    connections: 3.0,
                    p99_ms: (i > 0).then_some(3.1),
                })
                .collect(),
        };
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("go.csv");
        std::fs::write(&csv, "# source\nmounts,rss_kib,tcp_established,p99_ms\n0,29800,0,-\n2000,192304,2327,751.2\n").unwrap();
        let go = Series {
            label: "Go provider".into(),
            samples: read_baseline(&csv).unwrap(),
        };
        assert_eq!(go.samples.len(), 2);
        assert_eq!(go.samples[1].connections, 2327.0);
        assert_eq!(go.samples[0].p99_ms, None);
        let svg = svg("soak", &[ours, go]).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80]);
        for text in [
            "this provider",
            "Go provider",
            "resident memory (MiB)",
            "mounts completed",
        ] {
            assert!(svg.contains(text), "{text} missing");
        }
        // Three panels, each with a line per series (and its legend's sample line).
        for color in ["#1F77B4", "#D62728"] {
            let lines = svg
                .split("<polyline")
                .filter(|element| {
                    element
                        .split('>')
                        .next()
                        .unwrap_or_default()
                        .contains(color)
                })
                .count();
            assert_eq!(lines, 6, "{color}");
        }
    }

    #[test]
    fn a_malformed_baseline_names_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("go.csv");
        std::fs::write(&csv, "0,1,2\n").unwrap();
        let err = read_baseline(&csv).unwrap_err().to_string();
        assert!(err.contains("go.csv:1"), "{err}");
    }
}
