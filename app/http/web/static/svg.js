/* cka-atlas SVG helpers shared by the page's charts (heatmap.js, profile.js): load it first.
 *
 * CkaSvg.el(tag, attrs, parent, text) makes an SVG element with those attributes, its text,
 * appended to parent; CkaSvg.defined(v) says whether v is a finite number (a computed cell);
 * CkaSvg.chart(cls, width, height, label, matrix, attrs) makes the root <svg> of a chart of one
 * model pair.
 */
(function () {
  "use strict";

  const NS = "http://www.w3.org/2000/svg";

  function el(tag, attrs, parent, text) {
    const node = document.createElementNS(NS, tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, String(attrs[k])); });
    if (text !== undefined) node.textContent = text;
    if (parent) parent.appendChild(node);
    return node;
  }

  function defined(v) {
    return v !== null && v !== undefined && Number.isFinite(v);
  }

  // The root <svg> of a chart of the model pair ``matrix``: its class, size and viewBox, its
  // accessible label, the pair's names (data-a, data-b), then any further attributes.
  function chart(cls, width, height, label, matrix, attrs) {
    return el("svg", Object.assign({
      xmlns: NS,
      class: cls,
      width: width,
      height: height,
      viewBox: "0 0 " + width + " " + height,
      role: "img",
      "aria-label": label,
      "data-a": matrix.a,
      "data-b": matrix.b,
    }, attrs || {}));
  }

  window.CkaSvg = { NS: NS, el: el, defined: defined, chart: chart };
})();
