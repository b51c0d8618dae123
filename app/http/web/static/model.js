/* The model page's Delete button: asks first, and asks again, naming them, before it also
 * deletes the comparisons that use the model (the API refuses with 409 until told `force`). */
(function () {
  "use strict";

  document.addEventListener("DOMContentLoaded", function () {
    const button = document.getElementById("delete-model");
    if (!button) return;
    const message = document.getElementById("delete-message");
    const id = button.getAttribute("data-model-id");
    const name = button.getAttribute("data-model-name");

    function show(text) {
      message.textContent = text;
      message.hidden = false;
    }

    button.addEventListener("click", async function () {
      if (!window.confirm("Delete model " + name + "? Its weights and sidecar are removed.")) return;
      try {
        await window.cka.api("DELETE", "/v1/models/" + id);
      } catch (e) {
        if (e.status !== 409 || !e.problem || e.problem.code !== "model_in_use") {
          show(e.status === 401 || e.status === 403 ? "Deleting needs a token of scope admin." : e.message);
          return;
        }
        const used = e.problem.detail.split(";")[0]; /* "model 5 is used by comparisons [1, 2]" */
        if (!window.confirm(used.charAt(0).toUpperCase() + used.slice(1) + ". Delete them too?")) return;
        try {
          await window.cka.api("DELETE", "/v1/models/" + id + "?force=true");
        } catch (e2) {
          show(e2.message);
          return;
        }
      }
      window.location.assign("/models");
    });
  });
})();
