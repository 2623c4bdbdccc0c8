//! Line charts drawn on the server as SVG: values across revisions, each
//! with the base's samples (their span shaded, their median a line), axes with units.

use maud::{html, Markup};
use phyfarm::verdict::Movement;

use crate::model::Chart;
use crate::text::{sig, unit_scale};

const W: f64 = 640.0;
const H: f64 = 280.0;
const LEFT: f64 = 78.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 16.0;
const BOTTOM: f64 = 56.0;

/// Round numbers for axis ticks covering `lo..hi`.
pub fn ticks(lo: f64, hi: f64, want: usize) -> Vec<f64> {
    if !(lo.is_finite() && hi.is_finite()) || hi <= lo {
        return vec![lo];
    }
    let raw = (hi - lo) / want.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let mut t = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while t <= hi + step * 1e-9 && out.len() < 50 {
        out.push(if t.abs() < step * 1e-9 { 0.0 } else { t });
        t += step;
    }
    out
}

fn movement_class(m: Movement) -> &'static str {
    match m {
        Movement::Regression => "pt-regression",
        Movement::Improvement => "pt-improvement",
        Movement::WithinNoise => "pt-noise",
        Movement::NoBand | Movement::NoBase => "pt-noband",
    }
}

pub fn line_chart(c: &Chart) -> Markup {
    let pts = &c.points;
    let mut lo = f64::INFINITY;
    let mut hi = f64::NEG_INFINITY;
    for p in pts {
        lo = lo.min(p.value);
        hi = hi.max(p.value);
        if let Some(b) = p.band {
            lo = lo.min(b.low);
            hi = hi.max(b.high);
        }
    }
    if !lo.is_finite() {
        return html! { p.muted { "No values." } };
    }
    let span = (hi - lo).max(hi.abs() * 0.02).max(1e-12);
    let (lo, hi) = (lo - span * 0.15, hi + span * 0.15);
    let (factor, unit) = unit_scale(&c.unit, hi.abs().max(lo.abs()));
    let ys = ticks(lo / factor, hi / factor, 5);
    let (lo, hi) = (
        lo.min(ys.first().copied().unwrap_or(lo / factor) * factor),
        hi.max(ys.last().copied().unwrap_or(hi / factor) * factor),
    );
    let plot_w = W - LEFT - RIGHT;
    let plot_h = H - TOP - BOTTOM;
    let y = |v: f64| TOP + plot_h * (1.0 - (v - lo) / (hi - lo));
    let n = pts.len().max(1) as f64;
    let x = |i: usize| LEFT + plot_w * (i as f64 + 0.5) / n;
    let band_w = (plot_w / n * 0.35).clamp(6.0, 48.0);
    let line: Vec<String> = pts
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{:.1},{:.1}", x(i), y(p.value)))
        .collect();
    let title = c.title();
    html! {
        svg.chart viewBox=(format!("0 0 {W} {H}")) role="img" aria-label=(format!("{title} in {unit} by revision")) {
            title { (title) " in " (unit) " by revision" }
            @for t in &ys {
                line.grid x1=(LEFT) x2=(W - RIGHT) y1=(format!("{:.1}", y(t * factor))) y2=(format!("{:.1}", y(t * factor))) {}
                text.tick x=(LEFT - 8.0) y=(format!("{:.1}", y(t * factor) + 4.0)) text-anchor="end" { (sig(*t)) }
            }
            line.axis x1=(LEFT) x2=(LEFT) y1=(TOP) y2=(TOP + plot_h) {}
            line.axis x1=(LEFT) x2=(W - RIGHT) y1=(TOP + plot_h) y2=(TOP + plot_h) {}
            text.axis-label transform=(format!("translate(16 {:.1}) rotate(-90)", TOP + plot_h / 2.0)) text-anchor="middle" { (unit) }
            text.axis-label x=(LEFT + plot_w / 2.0) y=(H - 8.0) text-anchor="middle" { "revision" }
            @for (i, p) in pts.iter().enumerate() {
                @if let Some(b) = p.band {
                    rect.band x=(format!("{:.1}", x(i) - band_w / 2.0)) y=(format!("{:.1}", y(b.high)))
                        width=(format!("{band_w:.1}")) height=(format!("{:.1}", (y(b.low) - y(b.high)).max(1.0))) {
                        title { "base samples " (sig(b.low / factor)) "–" (sig(b.high / factor)) " " (unit) ", median " (sig(b.median / factor)) " (" (b.samples) " samples)" }
                    }
                    line.median x1=(format!("{:.1}", x(i) - band_w / 2.0)) x2=(format!("{:.1}", x(i) + band_w / 2.0))
                        y1=(format!("{:.1}", y(b.median))) y2=(format!("{:.1}", y(b.median))) {}
                }
                text.tick x=(format!("{:.1}", x(i))) y=(TOP + plot_h + 18.0) text-anchor="middle" { "v" (p.version) }
            }
            @if pts.len() > 1 {
                polyline.series points=(line.join(" ")) {}
            }
            @for (i, p) in pts.iter().enumerate() {
                circle class=(movement_class(p.movement)) cx=(format!("{:.1}", x(i))) cy=(format!("{:.1}", y(p.value))) r="5" {
                    title { (p.revision) ": median " (sig(p.value / factor)) " " (unit) " (" (p.samples) " samples): " (p.call) }
                }
                text.value x=(format!("{:.1}", x(i) + 9.0)) y=(format!("{:.1}", y(p.value) - 8.0)) { (sig(p.value / factor)) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(ticks(93.5, 94.6, 5), vec![93.5, 93.75, 94.0, 94.25, 94.5]);
        assert_eq!(ticks(0.0, 10.0, 5), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(ticks(5.0, 5.0, 5), vec![5.0]);
    }
}
