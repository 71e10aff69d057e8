// Applied before first paint (a classic script in <head>) so a chosen theme never flashes the other one.
try {
  const theme = localStorage.getItem("theme");
  if (theme === "light" || theme === "dark") document.documentElement.dataset.theme = theme;
} catch {
  /* storage may be blocked; the system preference applies */
}
