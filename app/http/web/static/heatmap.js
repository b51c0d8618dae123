/* cka-atlas heatmaps: a small, dependency-free SVG renderer for CKA matrices.
 *
 * CkaHeatmap.draw(host, matrix, options) replaces host's content with an <svg> whose
 * cells are <rect class="cell" data-i data-j data-value> (row i = layer i of model a,
 * column j = layer j of model b, input first), labelled with the layer names on both
 * axes and the model names as axis titles. Hovering a cell shows its verdicts in words
 * first, then the exact value, in a tooltip, and highlights its row and column labels.
 * Colours are viridis over [0, 1], the range of CKA; values outside it (the unbiased
 * estimator can dip below 0) keep the end colour but the tooltip shows the exact number.
 * With options.colour "learned" a cell is coloured by CKA minus its untrained twins' mean
 * (matrix.learned) on a diverging map centred at 0, over ±options.limit (the server gives the
 * PNG's analysis.plot.learned_limit). Undefined cells (null) are grey.
 *
 * matrix: {a, b, rows: [layer names], cols: [layer names], values: [[number|null]]} (with
 * measure and measureLabel when values are another measure than CKA, over [0, 1] too), and
 * optionally blocks of the same shape: ci_low, ci_high (bootstrap interval), p_value,
 * q_value (Benjamini–Hochberg over the comparison), null_mean (the null), random_init with
 * random_init_sd (its spread over random_init_draws draws) and seed_ceiling (baselines),
 * sensitivity (how far the value moves without either side's top principal component); and
 * `undefined`, per baseline the pair has none of, the reason; the verdicts (analysis.inference.verdicts):
 * learned with learned_low/high and learned_verdict, seed_gap with seed_gap_low/high and
 * seed_verdict, and `words`, each verdict in words. The tooltip shows those present (an
 * undefined baseline with its reason); a cell whose q-value is at least SIGNIFICANCE is
 * hatched (class "null-like"). With another measure, `flags` (per flag of the measure raised
 * in the pair, its boolean block) and `flagLabels` (each flag in words): a flagged cell is
 * cross-hatched (class "flagged", as the PNG marks it) and its tooltip says why, first
 * (flagLines; docs/measures.md, "Flags").
 */
(function () {
  "use strict";

  const NS = window.CkaSvg.NS;
  const el = window.CkaSvg.el;
  const defined = window.CkaSvg.defined;
  // matplotlib's viridis at 17 evenly spaced points.
  const VIRIDIS = [
    "#440154", "#48186a", "#472d7b", "#424086", "#3b528b", "#33638d", "#2c728e", "#26828e",
    "#21918c", "#1fa088", "#28ae80", "#3fbc73", "#5ec962", "#84d44b", "#addc30", "#d8e219",
    "#fde725",
  ].map(function (hex) {
    return [1, 3, 5].map(function (k) { return parseInt(hex.slice(k, k + 2), 16); });
  });
  // matplotlib's RdBu_r at 17 evenly spaced points: the learned scale (below 0 blue, above red).
  const DIVERGING = [
    "#053061", "#175290", "#2a71b2", "#3f8ec0", "#6bacd1", "#9bc9e0", "#c2ddec", "#e0ecf3",
    "#f7f6f6", "#fbe5d8", "#fbccb4", "#f5aa89", "#e48066", "#d05548", "#ba2832", "#930e26",
    "#67001f",
  ].map(function (hex) {
    return [1, 3, 5].map(function (k) { return parseInt(hex.slice(k, k + 2), 16); });
  });
  const UNDEFINED = "#bbbbbb"; // the grey of an undefined cell, as in the PNG (analysis/plot.py)
  const CHAR_EM = 0.61; // advance width of a monospace glyph, in em
  const SIGNIFICANCE = 0.05; // at or above this q-value a cell is not told apart from the null
  // What a cell's p-value rests on (the matrix's p_method; docs/analytic-null.md).
  const P_METHOD = {
    analytic: "analytic null",
    permutation: "permutations",
    monte_carlo: "drawn permutations",
    bound: "moment bound",
  };
  let tooltip = null;
  let gradientCount = 0;

  function interpolate(stops, t) {
    const x = Math.min(1, Math.max(0, t)) * (stops.length - 1);
    const i = Math.min(stops.length - 2, Math.floor(x));
    const f = x - i;
    const c = stops[i].map(function (lo, k) { return Math.round(lo + f * (stops[i + 1][k] - lo)); });
    return "rgb(" + c.join(",") + ")";
  }

  function color(v) {
    return defined(v) ? interpolate(VIRIDIS, v) : null;
  }

  /* A learned value on the diverging scale over [-limit, limit]. */
  function divergingColor(v, limit) {
    return defined(v) ? interpolate(DIVERGING, (v / limit + 1) / 2) : null;
  }

  function formatValue(v) {
    return defined(v) ? v.toFixed(4) : "undefined";
  }

  function longest(names) {
    return names.reduce(function (m, s) { return Math.max(m, String(s).length); }, 0);
  }

  function ensureTooltip() {
    if (tooltip) return tooltip;
    tooltip = document.createElement("div");
    tooltip.className = "heatmap-tooltip";
    tooltip.id = "heatmap-tooltip";
    tooltip.setAttribute("role", "tooltip");
    tooltip.hidden = true;
    document.body.appendChild(tooltip);
    return tooltip;
  }

  function line(parent, model, layer) {
    const row = document.createElement("div");
    row.className = "tt-layer";
    const m = document.createElement("span");
    m.className = "tt-model";
    m.textContent = model;
    const l = document.createElement("code");
    l.textContent = layer;
    row.append(m, " ", l);
    parent.appendChild(row);
  }

  function at(block, i, j) {
    return block && block[i] ? block[i][j] : null;
  }

  function fact(parent, cls, text) {
    const row = document.createElement("div");
    row.className = cls;
    row.textContent = text;
    parent.appendChild(row);
  }

  /* A p- or q-value as every view writes it (app/store/cells.py, probability_text: one rule,
     tests/e2e/test_browser.py holds them equal): three decimals; below 0.001 its order of
     magnitude (3e-05); below 1e-300 "<1e-300" (the analytic null reaches 0 in float64). */
  function formatP(p) {
    if (p >= 0.001) return p.toFixed(3);
    if (p < 1e-300) return "<1e-300";
    const parts = p.toExponential(0).split("e");
    const power = Number(parts[1]);
    return parts[0] + "e" + (power < 0 ? "-" : "+") + String(Math.abs(power)).padStart(2, "0");
  }

  function signed(v) {
    return (v >= 0 ? "+" : "\u2212") + Math.abs(v).toFixed(3);
  }

  /* The words of every flag raised at cell (i, j): its value is fixed, or mostly fixed, by
     the sample's size (a degenerate CCA, a saturated regression, ...). */
  function flagLines(matrix, i, j) {
    const labels = matrix.flagLabels || {};
    return Object.keys(matrix.flags || {}).filter(function (name) {
      return at(matrix.flags[name], i, j) === true;
    }).map(function (name) { return "Flagged: " + (labels[name] || name); });
  }

  /* The cell's verdicts in words, first: is it learned, is it as high as another seed. */
  function verdicts(tip, matrix, i, j) {
    const words = matrix.words || {};
    [["learned", "learned", "CKA \u2212 twins' mean"],
     ["seed", "seed_gap", "CKA \u2212 seed ceiling"]].forEach(function (q) {
      const verdict = at(matrix[q[1] === "learned" ? "learned_verdict" : "seed_verdict"], i, j);
      if (!verdict) return;
      const diff = at(matrix[q[1]], i, j);
      const lo = at(matrix[q[1] + "_low"], i, j);
      const hi = at(matrix[q[1] + "_high"], i, j);
      const ci = defined(lo) && defined(hi) ? " [" + signed(lo) + ", " + signed(hi) + "]" : " (interval unbounded)";
      const said = (words[q[0]] || {})[verdict] || verdict;
      const text = said.charAt(0).toUpperCase() + said.slice(1) + ": " + q[2] + " " + signed(diff) + ci;
      fact(tip, "tt-verdict tt-" + verdict.replace(/_/g, "-"), text);
    });
  }

  /* The cell's company: interval, p-value and null mean, baselines (those computed). */
  function company(tip, matrix, i, j) {
    const lo = at(matrix.ci_low, i, j);
    const hi = at(matrix.ci_high, i, j);
    if (defined(lo) && defined(hi)) {
      fact(tip, "tt-ci", "95 % interval [" + lo.toFixed(4) + ", " + hi.toFixed(4) + "]");
    }
    const p = at(matrix.p_value, i, j);
    if (defined(p)) {
      const q = at(matrix.q_value, i, j);
      const mean = at(matrix.null_mean, i, j);
      const method = at(matrix.p_method, i, j);
      const note = defined(q) && q >= SIGNIFICANCE ? " · not told apart from the null" : "";
      fact(
        tip,
        "tt-p",
        "p = " + formatP(p) + (P_METHOD[method] ? " (" + P_METHOD[method] + ")" : "") +
          (defined(q) ? " · q = " + formatP(q) : "") +
          (defined(mean) ? " · null mean " + mean.toFixed(4) : "") + note,
      );
    }
    const undefinedWhy = matrix.undefined || {};
    const init = at(matrix.random_init, i, j);
    const spread = at(matrix.random_init_sd, i, j);
    if (defined(init)) {
      const sd = defined(spread) ? " ± " + spread.toFixed(4) + " (sd over " + matrix.random_init_draws + " draws)" : "";
      fact(tip, "tt-base", "random init " + init.toFixed(4) + sd);
    } else if (undefinedWhy.random_init) {
      fact(tip, "tt-base tt-undefined", "random init undefined: " + undefinedWhy.random_init);
    }
    const seed = at(matrix.seed_ceiling, i, j);
    if (defined(seed)) {
      fact(tip, "tt-base", "seed ceiling " + seed.toFixed(4));
    } else if (undefinedWhy.seed_ceiling) {
      fact(tip, "tt-base tt-undefined", "seed ceiling undefined: " + undefinedWhy.seed_ceiling);
    }
    const moved = at(matrix.sensitivity, i, j);
    if (defined(moved)) fact(tip, "tt-base", "top component removed: moves " + moved.toFixed(4));
  }

  function showTip(event, matrix, i, j) {
    const tip = ensureTooltip();
    const v = matrix.values[i][j];
    tip.replaceChildren();
    verdicts(tip, matrix, i, j);
    const value = document.createElement("div");
    value.className = "tt-value";
    value.textContent = (matrix.measureLabel || "CKA") + " " + formatValue(v);
    tip.appendChild(value);
    flagLines(matrix, i, j).forEach(function (text) { fact(tip, "tt-flag", text); });
    company(tip, matrix, i, j);
    line(tip, matrix.a, matrix.rows[i]);
    line(tip, matrix.b, matrix.cols[j]);
    tip.hidden = false;
    moveTip(event);
  }

  function moveTip(event) {
    if (!tooltip || tooltip.hidden) return;
    const pad = 14;
    const w = tooltip.offsetWidth;
    const h = tooltip.offsetHeight;
    let x = event.clientX + pad;
    let y = event.clientY + pad;
    if (x + w > window.innerWidth - 4) x = event.clientX - w - pad;
    if (y + h > window.innerHeight - 4) y = event.clientY - h - pad;
    tooltip.style.left = Math.max(4, x) + "px";
    tooltip.style.top = Math.max(4, y) + "px";
  }

  function hideTip() {
    if (tooltip) tooltip.hidden = true;
  }

  /* Draw matrix into host; returns the <svg>. */
  function draw(host, matrix, options) {
    const o = Object.assign(
      { maxSize: 220, minCell: 6, maxCell: 28, font: 11, showValues: false, axisTitles: true, colour: "cka", limit: 0.05 },
      options || {}
    );
    const learned = o.colour === "learned" && matrix.learned;
    const nr = matrix.rows.length;
    const nc = matrix.cols.length;
    const fs = o.font;
    const charW = fs * CHAR_EM;
    const rowLabelW = Math.ceil(longest(matrix.rows) * charW) + 8;
    const colReach = Math.ceil(longest(matrix.cols) * charW * Math.SQRT1_2);
    const titleBand = o.axisTitles ? fs + 10 : 0;
    let cell = Math.floor(o.maxSize / Math.max(nr, nc, 1));
    // Shrink to the available width (options.fit, else the host's) when it is narrower.
    const room = (o.fit || host.clientWidth) - (titleBand + rowLabelW) - 8;
    if (room > 0) cell = Math.min(cell, Math.floor(room / Math.max(nc, 1)));
    cell = Math.max(o.minCell, Math.min(o.maxCell, cell));
    // Label every k-th layer when cells are smaller than the text.
    const step = Math.max(1, Math.ceil((fs + 1) / cell));
    const left = Math.max(titleBand + rowLabelW, colReach - cell / 2 + 4);
    const top = 6;
    const w = nc * cell;
    const h = nr * cell;
    const width = Math.ceil(left + w + 8);
    const height = Math.ceil(top + h + colReach + fs + 10 + titleBand);

    const label = (learned ? "CKA above untrained twins" : matrix.measureLabel || "CKA") + " between the layers of " +
      matrix.a + " (rows) and " + matrix.b + " (columns)";
    const svg = window.CkaSvg.chart("heatmap", width, height, label, matrix, {
      "data-rows": nr,
      "data-cols": nc,
      "data-colour": learned ? "learned" : "cka",
      "data-measure": matrix.measure || "cka",
      "font-size": fs,
    });
    const cells = el("g", { class: "cells", transform: "translate(" + left + "," + top + ")" }, svg);
    const showValues = o.showValues && cell >= 34;
    const hatchId = "cka-hatch-" + ++gradientCount;
    const hatch = el("pattern", {
      id: hatchId,
      patternUnits: "userSpaceOnUse",
      width: 6,
      height: 6,
      patternTransform: "rotate(45)",
    }, el("defs", {}, svg));
    el("rect", { width: 6, height: 6, fill: "rgba(255,255,255,0.45)" }, hatch);
    el("line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: "#ffffff", "stroke-width": 2.5 }, hatch);
    const overlays = [];
    const marked = [];
    const crossId = "cka-cross-" + gradientCount;
    const cross = el("pattern", {
      id: crossId,
      patternUnits: "userSpaceOnUse",
      width: 6,
      height: 6,
    }, el("defs", {}, svg));
    el("path", { d: "M0,0 L6,6 M6,0 L0,6", stroke: "#ffffff", "stroke-width": 1.2 }, cross);
    for (let i = 0; i < nr; i++) {
      for (let j = 0; j < nc; j++) {
        const v = matrix.values[i][j];
        const fill = learned ? divergingColor(at(matrix.learned, i, j), o.limit) : color(v);
        const q = at(matrix.q_value, i, j);
        const nullLike = defined(q) && q >= SIGNIFICANCE;
        if (nullLike) overlays.push([i, j]);
        const flagged = flagLines(matrix, i, j).length > 0;
        if (flagged) marked.push([i, j]);
        el("rect", {
          class: (fill ? "cell" : "cell undefined") + (nullLike ? " null-like" : "") + (flagged ? " flagged" : ""),
          x: j * cell,
          y: i * cell,
          width: cell,
          height: cell,
          fill: fill || UNDEFINED,
          "data-i": i,
          "data-j": j,
          "data-value": defined(v) ? String(v) : "null",
        }, cells);
        const shown = learned ? at(matrix.learned, i, j) : v;
        if (showValues && defined(shown)) {
          el("text", {
            class: "cell-value",
            x: j * cell + cell / 2,
            y: i * cell + cell / 2,
            "text-anchor": "middle",
            "dominant-baseline": "central",
            fill: learned ? (Math.abs(at(matrix.learned, i, j) || 0) > 0.6 * o.limit ? "#ffffff" : "#1d1d1f") : v > 0.6 ? "#1d1d1f" : "#ffffff",
            "font-size": Math.min(fs, Math.floor(cell / 3.2)),
          }, cells, learned ? (shown >= 0 ? "+" : "\u2212") + Math.abs(shown).toFixed(2) : v.toFixed(2));
        }
      }
    }
    // A pattern over some cells that lets the pointer through to the cell underneath.
    function cover(list, cls, patternId) {
      list.forEach(function (ij) {
        el("rect", {
          class: cls,
          x: ij[1] * cell,
          y: ij[0] * cell,
          width: cell,
          height: cell,
          fill: "url(#" + patternId + ")",
          "pointer-events": "none",
        }, cells);
      });
    }
    cover(overlays, "hatch", hatchId); // the cells the permutation null cannot tell apart
    cover(marked, "flag-mark", crossId); // the cells a flag of the measure is raised at
    el("rect", { class: "frame", x: 0, y: 0, width: w, height: h, fill: "none" }, cells);

    const rowLabels = el("g", { class: "row-labels" }, svg);
    matrix.rows.forEach(function (name, i) {
      el("text", {
        class: "row-label" + (i % step ? " skipped" : ""),
        x: left - 6,
        y: top + i * cell + cell / 2,
        "text-anchor": "end",
        "dominant-baseline": "central",
        "data-i": i,
      }, rowLabels, name);
    });
    const colLabels = el("g", { class: "col-labels" }, svg);
    matrix.cols.forEach(function (name, j) {
      const x = left + j * cell + cell / 2;
      const y = top + h + 6;
      el("text", {
        class: "col-label" + (j % step ? " skipped" : ""),
        transform: "translate(" + x + "," + y + ") rotate(-45)",
        "text-anchor": "end",
        "dominant-baseline": "central",
        "data-j": j,
      }, colLabels, name);
    });
    if (o.axisTitles) {
      el("text", {
        class: "axis-title",
        transform: "translate(" + (fs + 2) + "," + (top + h / 2) + ") rotate(-90)",
        "text-anchor": "middle",
      }, svg, matrix.a);
      el("text", {
        class: "axis-title",
        x: left + w / 2,
        y: height - 4,
        "text-anchor": "middle",
      }, svg, matrix.b);
    }

    let active = null;
    function highlight(i, j) {
      svg.querySelectorAll(".active").forEach(function (n) { n.classList.remove("active"); });
      if (i === null) return;
      const r = svg.querySelector('.row-label[data-i="' + i + '"]');
      const c = svg.querySelector('.col-label[data-j="' + j + '"]');
      if (r) r.classList.add("active");
      if (c) c.classList.add("active");
    }
    cells.addEventListener("mouseover", function (event) {
      const t = event.target;
      if (!(t instanceof SVGRectElement) || !t.classList.contains("cell")) return;
      const i = Number(t.getAttribute("data-i"));
      const j = Number(t.getAttribute("data-j"));
      if (active === t) return;
      active = t;
      highlight(i, j);
      showTip(event, matrix, i, j);
    });
    cells.addEventListener("mousemove", moveTip);
    cells.addEventListener("mouseleave", function () {
      active = null;
      highlight(null, null);
      hideTip();
    });
    host.replaceChildren(svg);
    return svg;
  }

  /* A vertical colour bar, `height` pixels tall: CKA over [0, 1], or with mode "learned"
   * CKA minus the untrained twins' mean over [-limit, limit]; `title` names another
   * measure over [0, 1]. */
  function colorbar(host, height, mode, limit, title) {
    const h = height || 200;
    const learned = mode === "learned";
    const lim = limit || 0.05;
    const id = "cka-gradient-" + ++gradientCount;
    const width = 64;
    const svg = el("svg", {
      xmlns: NS,
      class: "colorbar",
      width: width,
      height: h + 28,
      viewBox: "0 0 " + width + " " + (h + 28),
      role: "img",
      "data-colour": learned ? "learned" : "cka",
      "aria-label": learned
        ? "Colour scale: CKA minus the untrained twins' mean, from " + (-lim).toFixed(2) + " to " + lim.toFixed(2)
        : "Colour scale: " + (title || "CKA") + " from 0 to 1",
    });
    const grad = el("linearGradient", { id: id, x1: 0, y1: 1, x2: 0, y2: 0 }, el("defs", {}, svg));
    const stops = learned ? DIVERGING : VIRIDIS;
    stops.forEach(function (_, k) {
      const t = k / (stops.length - 1);
      el("stop", { offset: t, "stop-color": interpolate(stops, t) }, grad);
    });
    el("text", { class: "colorbar-title", x: 2, y: 11 }, svg, learned ? "learned" : title || "CKA");
    el("rect", { x: 2, y: 20, width: 16, height: h, fill: "url(#" + id + ")", class: "frame" }, svg);
    [0, 0.25, 0.5, 0.75, 1].forEach(function (t) {
      const y = 20 + (1 - t) * h;
      const value = learned ? (2 * t - 1) * lim : t;
      el("line", { x1: 18, x2: 23, y1: y, y2: y, class: "tick" }, svg);
      el("text", { x: 26, y: y, "dominant-baseline": "central", class: "tick-label" }, svg,
        learned && value > 0 ? "+" + value.toFixed(2) : value.toFixed(2));
    });
    host.replaceChildren(svg);
    return svg;
  }

  window.CkaHeatmap = {
    draw: draw,
    colorbar: colorbar,
    color: color,
    divergingColor: divergingColor,
    formatValue: formatValue,
    formatP: formatP,
    flagLines: flagLines,
    SIGNIFICANCE: SIGNIFICANCE,
  };
})();
