/**
 * The chart of one trace, as a hand-written SVG: one panel per policy, each showing over time the
 * nodes in use (area, right axis), the backing nodes billed (line, left axis) and the lower bound
 * (dashed, left axis). The right axis is the left one times the slots per backing node, so the area
 * touches the bound where the bound is exact and the gap between the area and the line is paid-for
 * room.
 */
import type { Series } from './simulate.ts';

export interface Panel {
  readonly title: string;
  readonly backing: Series;
  readonly inUse: Series;
}

export interface Chart {
  readonly title: string;
  readonly subtitle: string;
  readonly bound: Series;
  /** Slots of the pool (the bound's unit). */
  readonly slots: number;
  readonly panels: readonly Panel[];
}

const W = 1100;
const LEFT = 64;
const RIGHT = 64;
const TOP = 78;
const PANEL_H = 180;
const GAP = 62;
const COLORS = { backing: '#1d4ed8', bound: '#111827', inUse: '#f59e0b', grid: '#e5e7eb', text: '#111827' };

export function renderChart(c: Chart): string {
  const height = TOP + c.panels.length * (PANEL_H + GAP) + 10;
  const tMax = Math.max(...[c.bound, ...c.panels.flatMap((p) => [p.backing, p.inUse])].map(lastT), 1);
  const xStep = niceStep(tMax / 3600, 12);
  const plotW = W - LEFT - RIGHT;
  const x = (s: number) => LEFT + (s / tMax) * plotW;
  const out: string[] = [];
  out.push(
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${height}" viewBox="0 0 ${W} ${height}" font-family="Helvetica, Arial, sans-serif" font-size="12" role="img">`,
    `<title>${esc(`${c.title}. ${c.subtitle}`)}</title>`,
    `<rect width="${W}" height="${height}" fill="#ffffff"/>`,
    `<text x="${LEFT}" y="24" font-size="17" font-weight="bold" fill="${COLORS.text}">${esc(c.title)}</text>`,
    `<text x="${LEFT}" y="44" fill="#4b5563">${esc(c.subtitle)}</text>`,
  );
  // Legend.
  const ly = 62;
  out.push(
    `<line x1="${LEFT}" y1="${ly}" x2="${LEFT + 24}" y2="${ly}" stroke="${COLORS.backing}" stroke-width="2"/>`,
    `<text x="${LEFT + 30}" y="${ly + 4}">backing nodes billed (left axis)</text>`,
    `<line x1="${LEFT + 250}" y1="${ly}" x2="${LEFT + 274}" y2="${ly}" stroke="${COLORS.bound}" stroke-width="1.5" stroke-dasharray="5 3"/>`,
    `<text x="${LEFT + 280}" y="${ly + 4}">lower bound: ceil(nodes in use / ${c.slots}) (left axis)</text>`,
    `<rect x="${LEFT + 580}" y="${ly - 6}" width="24" height="12" fill="${COLORS.inUse}" fill-opacity="0.4"/>`,
    `<text x="${LEFT + 610}" y="${ly + 4}">nodes in use, jobs running (right axis)</text>`,
  );
  c.panels.forEach((p, i) => {
    const top = TOP + i * (PANEL_H + GAP) + 20;
    const bottom = top + PANEL_H;
    const yMaxRaw = Math.max(maxV(p.backing), maxV(c.bound), maxV(p.inUse) / c.slots, 1);
    const yStep = niceStep(yMaxRaw, 5);
    const yMax = Math.ceil(yMaxRaw / yStep) * yStep;
    const y = (v: number) => bottom - (v / yMax) * PANEL_H;
    out.push(`<text x="${LEFT}" y="${top - 8}" font-weight="bold">${esc(p.title)}</text>`);
    // Grid and axes.
    for (let v = 0; v <= yMax + 1e-9; v += yStep) {
      const yy = fmt(y(v));
      out.push(
        `<line x1="${LEFT}" y1="${yy}" x2="${W - RIGHT}" y2="${yy}" stroke="${COLORS.grid}"/>`,
        `<text x="${LEFT - 6}" y="${fmt(y(v) + 4)}" text-anchor="end">${num(v)}</text>`,
        `<text x="${W - RIGHT + 6}" y="${fmt(y(v) + 4)}" fill="#92400e">${num(v * c.slots)}</text>`,
      );
    }
    for (let h = 0; h <= tMax / 3600 + 1e-9; h += xStep) {
      const xx = fmt(x(h * 3600));
      out.push(
        `<line x1="${xx}" y1="${top}" x2="${xx}" y2="${bottom}" stroke="${COLORS.grid}"/>`,
        `<text x="${xx}" y="${bottom + 16}" text-anchor="middle">${num(h)} h</text>`,
      );
    }
    out.push(
      `<text transform="translate(${LEFT - 44} ${(top + bottom) / 2}) rotate(-90)" text-anchor="middle">backing nodes</text>`,
      `<text transform="translate(${W - RIGHT + 48} ${(top + bottom) / 2}) rotate(90)" text-anchor="middle" fill="#92400e">nodes</text>`,
    );
    // Series: nodes in use (area, in backing-node units), the bound, the billed backing nodes.
    out.push(
      `<path d="${areaPath(p.inUse, x, (v) => y(v / c.slots), bottom, tMax)}" fill="${COLORS.inUse}" fill-opacity="0.4" stroke="none"/>`,
      `<path d="${stepPath(c.bound, x, y, tMax)}" fill="none" stroke="${COLORS.bound}" stroke-width="1.2" stroke-dasharray="5 3"/>`,
      `<path d="${stepPath(p.backing, x, y, tMax)}" fill="none" stroke="${COLORS.backing}" stroke-width="1.5"/>`,
      `<line x1="${LEFT}" y1="${bottom}" x2="${W - RIGHT}" y2="${bottom}" stroke="#6b7280"/>`,
    );
  });
  out.push('</svg>');
  return `${out.join('\n')}\n`;
}

function stepPath(s: Series, x: (t: number) => number, y: (v: number) => number, tMax: number): string {
  const parts = [`M${fmt(x(s.t[0] ?? 0))} ${fmt(y(s.v[0] ?? 0))}`];
  for (let i = 1; i < s.t.length; i++) {
    parts.push(`H${fmt(x(s.t[i] as number))}V${fmt(y(s.v[i] as number))}`);
  }
  parts.push(`H${fmt(x(tMax))}`);
  return parts.join('');
}

function areaPath(
  s: Series,
  x: (t: number) => number,
  y: (v: number) => number,
  base: number,
  tMax: number,
): string {
  return `M${fmt(x(0))} ${fmt(base)}V${fmt(y(s.v[0] ?? 0))}${stepPath(s, x, y, tMax).replace(/^M[^H]*/, '')}V${fmt(base)}Z`;
}

function lastT(s: Series): number {
  return s.t[s.t.length - 1] ?? 0;
}

function maxV(s: Series): number {
  return s.v.reduce((m, v) => Math.max(m, v), 0);
}

/** A 1-2-5 step giving about `target` intervals over `range`. */
export function niceStep(range: number, target: number): number {
  const raw = range / target;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const r = raw / mag;
  return (r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10) * mag;
}

const fmt = (n: number) => (Math.round(n * 10) / 10).toString();
const num = (n: number) => (Math.round(n * 100) / 100).toString();
const esc = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
