// Message templates of the policy, filled in where a core raises them.
#include "aten/policy.h"

namespace neuron_lab {

std::string fill(std::string text, std::initializer_list<std::pair<const char*, std::string>> values) {
  for (const auto& [name, value] : values) {
    const std::string key = std::string("{") + name + "}";
    for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + value.size())) {
      text.replace(at, key.size(), value);
    }
  }
  return text;
}

}  // namespace neuron_lab
