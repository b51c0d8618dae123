/* Upload forms (a model, a dataset): POST the form as multipart to its REST endpoint, then
 * open what was stored. The endpoint answers 201 for a new item and 200 for one already
 * stored (same content); either way the page follows the Location it names. */
(function () {
  "use strict";

  function setup(form) {
    const submit = form.querySelector("button[type=submit]");
    const error = form.querySelector(".form-error");
    const label = submit.textContent;

    form.addEventListener("submit", async function (event) {
      event.preventDefault();
      error.textContent = "";
      const data = new FormData(form);
      /* Empty file inputs and blank names are left out, so the API sees only what was given. */
      Array.from(data.keys()).forEach(function (key) {
        const value = data.get(key);
        if ((value instanceof File && !value.name) || value === "") data.delete(key);
      });
      submit.disabled = true;
      submit.textContent = "Uploading…";
      try {
        const res = await window.cka.api("POST", form.getAttribute("data-endpoint"), data);
        window.location.assign(form.getAttribute("data-page") + res.data.id);
        return;
      } catch (e) {
        error.textContent = e.status === 401 || e.status === 403
          ? "Sign in with a token of scope write to upload."
          : (e.problem && e.problem.detail) || e.message;
      }
      submit.disabled = false;
      submit.textContent = label;
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("form[data-endpoint]").forEach(setup);
  });
})();
