/* Depth profile of one model pair: CKA per layer of the row model, as a small SVG chart.
 *
 * CkaProfile.draw(host, matrix) with the matrix of CkaHeatmap.draw (values and the optional
 * ci_low, ci_high, random_init, seed_ceiling blocks) draws, over the layers of model a:
 *   - "diagonal": CKA of layer i of a with layer i of b (only when both have as many layers),
 *     with its bootstrap interval as a band;
 *   - "best match": CKA of layer i of a with its most similar layer of b, with the band of
 *     that cell;
 *   - the baselines at the same cells as the first of these: "random init" (dashed) and
 *     "seed ceiling" (dotted).
 * Each series is a <path class="series" data-series="..."> whose data-values lists its values.
 */
(function () {
  "use strict";

  const el = window.CkaSvg.el;
  const defined = window.CkaSvg.defined;

  function pick(block, cells) {
    return block ? cells.map(function (c) { return c[1] === null ? null : block[c[0]][c[1]]; }) : null;
  }

  /* The (row, column) cells of each line: the diagonal, and each row's best match. */
  function lines(matrix) {
    const nr = matrix.rows.length;
    const out = [];
    const best = [];
    for (let i = 0; i < nr; i++) {
      let arg = null;
      matrix.values[i].forEach(function (v, j) {
        if (defined(v) && (arg === null || v > matrix.values[i][arg])) arg = j;
      });
      best.push([i, arg]);
    }
    if (nr === matrix.cols.length) {
      out.push({ name: "diagonal", cells: matrix.rows.map(function (_, i) { return [i, i]; }) });
    }
    out.push({ name: "best match", cells: best });
    return out;
  }

  // Tick labels of the layers are rotated by this much (degrees), anchored at their end.
  const ANGLE = 35;
  const COS = Math.cos(ANGLE * Math.PI / 180);
  const SIN = Math.sin(ANGLE * Math.PI / 180);

  /* Widths of ``texts`` in ``svg`` (attached, styled) as elements of class ``cls`` draw them. */
  function measure(svg, texts, cls) {
    const probe = el("text", { class: cls }, svg);
    const widths = texts.map(function (t) { probe.textContent = t; return probe.getComputedTextLength(); });
    probe.remove();
    return widths;
  }

  /* The chart fills ``fit`` (its card's width; else ``width``). Its margins are measured from
   * the labels it draws, so that every label, the first layer's included, lies inside it. */
  function draw(host, matrix, options) {
    const o = Object.assign({ width: 460, height: 230 }, options || {});
    const width = Math.max(260, Math.floor(o.fit || o.width));
    const nr = matrix.rows.length;
    const series = lines(matrix);
    const all = [];
    series.forEach(function (s) {
      s.values = pick(matrix.values, s.cells);
      s.low = pick(matrix.ci_low, s.cells);
      s.high = pick(matrix.ci_high, s.cells);
      all.push.apply(all, s.values.filter(defined));
    });
    const ref = series[0];
    const baselines = [
      { name: "random init", values: pick(matrix.random_init, ref.cells), cls: "baseline-init" },
      { name: "seed ceiling", values: pick(matrix.seed_ceiling, ref.cells), cls: "baseline-seed" },
    ].filter(function (b) { return b.values && b.values.some(defined); });
    baselines.forEach(function (b) { all.push.apply(all, b.values.filter(defined)); });
    const ymin = Math.min(0, Math.min.apply(null, all.length ? all : [0]));
    const ticks = [ymin, 0.5, 1];
    const label = "CKA per layer of " + matrix.a + " against " + matrix.b;
    const svg = window.CkaSvg.chart("profile", width, o.height, label, matrix);
    host.replaceChildren(svg); // attached first: the labels are measured as the page styles them
    const fs = parseFloat(window.getComputedStyle(svg).fontSize) || 10;
    const tickWidth = Math.max.apply(null, measure(svg, ticks.map(function (t) { return t.toFixed(1); }), "tick-label"));
    const names = measure(svg, matrix.rows, "tick-label");
    const legendItems = series.map(function (s, k) { return { name: s.name, cls: "series-" + (k === 0 ? "primary" : "secondary") }; })
      .concat(baselines.map(function (b) { return { name: b.name, cls: b.cls }; }));
    const legendWidths = measure(svg, legendItems.map(function (i) { return i.name; }), "legend-label");
    // A rotated label reaches w·cos left of its anchor and w·sin below it (plus its own height).
    const reachLeft = function (w) { return w * COS + fs * SIN; };
    const reachDown = function (w) { return w * SIN + fs * COS; };
    const gap = 8;
    const legendHeight = fs + 10;
    const m = { top: 10, right: 14 + fs * SIN };
    m.left = Math.ceil(Math.max(tickWidth + 10, (names.length ? reachLeft(names[0]) : 0) + 2, 36));
    const plotWidth = width - m.left - m.right;
    const step = Math.max(1, Math.ceil((nr * 1.9 * fs) / Math.max(plotWidth, 1)));
    const shown = matrix.rows.map(function (_, i) { return i; }).filter(function (i) { return i % step === 0; });
    const deepest = Math.max.apply(null, shown.map(function (i) { return reachDown(names[i]); }).concat([0]));
    m.bottom = Math.ceil(gap + deepest + gap + legendHeight);
    const height = Math.max(o.height, m.top + 120 + m.bottom);
    svg.setAttribute("height", height);
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
    const x = function (i) { return m.left + (nr > 1 ? (i / (nr - 1)) * plotWidth : 0); };
    const y = function (v) { return m.top + (1 - (v - ymin) / (1 - ymin)) * (height - m.top - m.bottom); };
    ticks.forEach(function (t) {
      el("line", { class: "grid", x1: m.left, x2: width - m.right, y1: y(t), y2: y(t) }, svg);
      el("text", { class: "tick-label", x: m.left - 6, y: y(t), "text-anchor": "end", "dominant-baseline": "central" }, svg, t.toFixed(1));
    });
    shown.forEach(function (i) {
      el("text", {
        class: "tick-label layer-label",
        transform: "translate(" + x(i).toFixed(1) + "," + (height - m.bottom + gap + fs * 0.6).toFixed(1) + ") rotate(-" + ANGLE + ")",
        "text-anchor": "end",
      }, svg, matrix.rows[i]);
    });
    function path(values) {
      let d = "";
      let pen = false;
      values.forEach(function (v, i) {
        if (!defined(v)) { pen = false; return; }
        d += (pen ? " L" : " M") + x(i).toFixed(1) + "," + y(v).toFixed(1);
        pen = true;
      });
      return d.trim();
    }
    series.forEach(function (s, k) {
      const cls = k === 0 ? "primary" : "secondary";
      if (s.low && s.high) {
        const top = [];
        const bottom = [];
        s.low.forEach(function (lo, i) {
          if (defined(lo) && defined(s.high[i])) {
            top.push(x(i).toFixed(1) + "," + y(s.high[i]).toFixed(1));
            bottom.unshift(x(i).toFixed(1) + "," + y(lo).toFixed(1));
          }
        });
        if (top.length) el("polygon", { class: "band band-" + cls, points: top.concat(bottom).join(" ") }, svg);
      }
      el("path", { class: "series series-" + cls, "data-series": s.name, "data-values": JSON.stringify(s.values), d: path(s.values) }, svg);
    });
    baselines.forEach(function (b) {
      el("path", { class: "series " + b.cls, "data-series": b.name, "data-values": JSON.stringify(b.values), d: path(b.values) }, svg);
    });
    const legend = el("g", { class: "legend", transform: "translate(" + m.left + "," + (height - legendHeight / 2 - 2) + ")" }, svg);
    let lx = 0;
    legendItems.forEach(function (item, k) {
      el("line", { class: "series " + item.cls, x1: lx, x2: lx + 22, y1: 0, y2: 0 }, legend);
      el("text", { class: "legend-label", x: lx + 28, y: 0, "dominant-baseline": "central" }, legend, item.name);
      lx += 28 + legendWidths[k] + 20;
    });
    return svg;
  }

  window.CkaProfile = { draw: draw };
})();
